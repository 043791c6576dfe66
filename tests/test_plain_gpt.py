"""PlainGPT, notebook 10's peer: the dense HybridModel's function, written with plain PyTorch (CPU)."""

import pytest
import torch

from mahia.model import HybridConfig, HybridModel
from mahia.model.plain_gpt import PlainGPT, from_hybrid_state_dict

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _cfg(**kw):
    base = dict(vocab_size=97, dim=48, n_layers=2, n_heads=4, n_kv_heads=2, hidden=80, max_seq_len=32)
    return HybridConfig.preset("dense-350m", **{**base, **kw})


@pytest.mark.parametrize("kv", [4, 2], ids=["mha", "gqa"])
def test_plain_gpt_computes_the_dense_models_function(kv):
    cfg = _cfg(n_kv_heads=kv)
    torch.manual_seed(0)
    dense = HybridModel(cfg.optimized().replace(kernels="eager"))
    plain = PlainGPT(cfg)
    assert plain.param_count() == dense.param_count()
    plain.load_state_dict(from_hybrid_state_dict(dense.state_dict()))
    idx, targets = torch.randint(0, 97, (3, 19)), torch.randint(0, 97, (3, 19))
    (ld, lossd), (lp, lossp) = dense(idx, targets), plain(idx, targets)
    torch.testing.assert_close(lp, ld, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lossp, lossd, rtol=1e-5, atol=1e-6)
    lossd.backward()
    lossp.backward()
    for (nd, pd_), (np_, pp) in zip(dense.named_parameters(), plain.named_parameters()):  # same order
        torch.testing.assert_close(pp.grad, pd_.grad, rtol=1e-4, atol=1e-6, msg=f"{nd} / {np_}")
    assert plain(idx)[1] is None


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: PlainGPT(HybridConfig.preset("tiny")), ValueError, "hybrid parts"),
        (lambda: PlainGPT("dense-350m"), TypeError, "HybridConfig"),
        (lambda: PlainGPT(_cfg())(torch.zeros(2, 4)), ValueError, "int64 token ids"),
        (lambda: PlainGPT(_cfg())(torch.zeros(1, 33, dtype=torch.long)), ValueError, "max_seq_len"),
        (lambda: from_hybrid_state_dict([1]), TypeError, "dict"),
    ],
)
def test_plain_gpt_refuses_hybrid_parts_and_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
