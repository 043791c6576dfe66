"""Helpers shared by the test modules (tests/ is on sys.path under pytest's default import mode)."""
import torch


def graph_ops(fn, *args):
    """Names of the ops Dynamo puts in the graph of ``fn`` (fullgraph: a graph break raises)."""
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, fullgraph=True, backend=backend)(*args)
    return seen
