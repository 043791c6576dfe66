"""mahia.lessons.kernel_listings: every listed object resolves to code with a source."""

import inspect

import pytest

from mahia.lessons import kernel_listings as kl


@pytest.mark.parametrize("name", sorted(kl.LISTINGS))
def test_every_listing_resolves_to_code_with_a_source(name):
    obj = kl.listing(name)
    src = inspect.getsource(getattr(obj, "fn", obj))  # a @triton.jit kernel wraps the function it compiles
    assert src.lstrip().startswith(("def ", "@"))


def test_unknown_listing_names_the_listed_ones():
    with pytest.raises(KeyError, match="decoder_step"):
        kl.listing("no_such_kernel")
