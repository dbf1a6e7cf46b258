"""FP8 training flags (--fp8-format, --fp8-recipe, --fp8-param-gather): TransformerEngine's FP8 in the Megatron
trainer's layers where the stack runs it (megatron-core's TransformerConfig fp8 / fp8_recipe / fp8_param), a clear
launch refusal on a machine with no GPU, and errors naming what is missing where the GPU stack lacks it (a stub
TransformerEngine distribution stands in for the installed one: the probes read metadata, they import nothing)."""
import pytest
from test_kernel_defaults import _plain, stubs  # noqa: F401  (fixture)

from slime_like.backends.megatron import kernels
from slime_like.backends.megatron.transformer_config import FP8_CAPABILITY

FP8 = ("--fp8-format", "e4m3")


def test_te_spec_on_cuda_gets_the_fp8_fields(stubs):  # noqa: F811
    stubs("transformer_engine", "2.5.0")
    res = kernels.check(_plain(*FP8, "--fp8-recipe", "blockwise", "--fp8-param-gather"), cuda=True)
    assert res.te_spec
    assert (res.fields["fp8"], res.fields["fp8_recipe"], res.fields["fp8_param"]) == ("e4m3", "blockwise", True)
    assert "fp8" not in kernels.check(_plain(), cuda=True).fields


def test_what_the_stack_lacks_is_named(stubs):  # noqa: F811
    with pytest.raises(ValueError, match="TransformerEngine's spec is not installed"):
        kernels.check(_plain(*FP8), cuda=True)
    with pytest.raises(ValueError, match="none is visible"):
        kernels.check(_plain(*FP8), cuda=False)
    stubs("transformer_engine", "2.1.0")
    with pytest.raises(ValueError, match=r"--fp8-recipe tensorwise needs TransformerEngine >= 2.2 \(found 2.1.0\)"):
        kernels.check(_plain(*FP8, "--fp8-recipe", "tensorwise"), cuda=True)
    with pytest.raises(ValueError, match="not chosen"):
        kernels.check(_plain(*FP8, "--transformer-impl", "local"), cuda=True)
    assert FP8_CAPABILITY["mxfp8"] == (10, 0) and FP8_CAPABILITY["delayed"] == (8, 9)
