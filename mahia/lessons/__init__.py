"""What only the notebooks need, on the top floor of mahia (nothing else imports it).

Each module says which notebooks use it: ``notebook`` (all: set-up, listings, explorers),
``sync_loops`` (01), ``graphs_and_compile`` (04, 05), ``training`` (06, 07),
``hybrid_parts`` (08, 09), ``full_stack`` (10).
"""
