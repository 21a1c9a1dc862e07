"""Every mul-add form (`fma(a,b,c)`, `mad(a,b,c)`, `a*b+c`; clexpr.muladd, chosen by the
calibration) in the kernels that write one: contractions on the CPU and GPU paths, and
attention in its row and tiled forms.  Run on the CPU device with outputs poisoned first and
compared with the numpy reference on random inputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import tilec
from tilec.codegen.clexpr import muladd
from tilec.config import Config
from tilec.plan.calibration import MULADD_FORMS
from tilec.plan.hw import HwModel

from ..device import CPU, needs_device
from ..kernel_cases import CASES
from .test_attention import CAUSAL, program, shapes
from .test_kernels import check_run

SPELLED = {"fma": "fma(", "mad": "mad(", "mul_add": " * "}


def test_muladd_text():
    assert muladd("a", "b[i]", "c.x", "fma") == "fma(a, b[i], c.x)"
    assert muladd("a", "b", "c", "mad") == "mad(a, b, c)"
    assert muladd("x ? y : 0", "A_s[k * 4 + 1]", "acc[0]", "mul_add") == \
        "((x ? y : 0) * A_s[k * 4 + 1] + acc[0])"
    with pytest.raises(ValueError):
        muladd("a", "b", "c", "fmaa")


def device(base: str | None) -> str | None:
    """Where a model's kernels run: a CPU model's (prefetch builtins, the calibration's
    vector forms) on a CPU device, a GPU model's on the default one (a GPU where there is)."""
    return CPU if base is None else None


def model(base: str | None, form: str) -> HwModel:
    from tilec.runtime.device import Runtime
    from tilec.runtime.device_model import hw_model_for

    runtime = Runtime.get(device(base))
    hw = hw_model_for(base, Config(device=device(base), calibrate=False), runtime)
    return dataclasses.replace(hw, muladd=form)


@needs_device
@pytest.mark.parametrize("form", MULADD_FORMS)
@pytest.mark.parametrize("base", [None, "nvidia-h100"])
@pytest.mark.parametrize("name", ["matmul_odd", "conv_same_relu", "depthwise"])
def test_contraction_with_each_form(form, base, name):
    src, shp = CASES[name]
    exe = tilec.compile(src, shp, hw=model(base, form), device=device(base))
    # Products only: a relaid filter's copy (`K_t`, `plan.pack`) multiplies nothing.
    body = [s.text for s in exe.sources if s.kind == "contraction" and
            not s.name.endswith("_t")]
    assert body and all(SPELLED[form] in t for t in body)
    if form != "fma":
        assert not any("fma(" in t for t in body)
    check_run(exe, seed=11)  # against numpy, outputs poisoned, no NaN


@needs_device
@pytest.mark.parametrize("form", MULADD_FORMS)
@pytest.mark.parametrize("base", [None, "nvidia-h100"])  # the row form; the tiled form
def test_attention_with_each_form(form, base):
    shp = shapes(1, 2, 70, 33, 32, 32)
    src = program(CAUSAL)
    rng = np.random.default_rng(5)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in shp.items()}
    exe = tilec.compile(src, shp, hw=model(base, form),
                        config=Config(device=device(base), attention_fusion=True))
    assert [s.kind for s in exe.sources] == ["attention"]
    assert SPELLED[form] in exe.sources[0].text
    got = exe.run(arrays, poison=True)["O"]
    ref = tilec.evaluate(src, **arrays)["O"]
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)


# Rows of a length no vector divides (a scalar rest), several rows a work-group.
ROW_CASES = {
    "softmax_rows": ("""function (X[R, C]) -> (Y) {
  M[r, 0 : R, 1] = >(X[r, c]);
  E = exp(X - M);
  S[r, 0 : R, 1] = +(E[r, c]);
  Y = E / S;
}""", {"X": (37, 203)}),
}


@needs_device
@pytest.mark.parametrize("access", ["vload", "plain"])
@pytest.mark.parametrize("name", ["matmul_odd", "matmul_panels", "conv_same_relu",
                                  "conv_nchw_pad_bias_relu", "maxpool", "depthwise",
                                  "softmax", "softmax_rows"])
def test_contraction_with_each_vector_access(access, name):
    """The calibration's vector access form (plan/calibration.choose_access) at the widest
    vectors the device computes: vloadN/vstoreN, or pointers to the vector type; row kernels
    (softmax) too, their max as a compare and select where the access is plain."""
    from tilec.runtime.device import Runtime

    base = model(None, "mul_add")
    wide = min(16, Runtime.get(CPU).vector_limit or 16)
    hw = dataclasses.replace(base, vec_size=wide, vector_access=access)
    src, shp = ROW_CASES[name] if name in ROW_CASES else CASES[name]
    exe = tilec.compile(src, shp, hw=hw, device=CPU)
    body = "\n".join(s.text for s in exe.sources if s.kind in ("contraction", "row"))
    pointer = "*((__global"
    if access == "plain":
        assert "vload" not in body and "vstore" not in body
        assert name == "maxpool" or pointer in body  # (its vectors are narrow: lanes walked)
        # relu too is a compare and select on a named value, not the builtin fmax
        assert "fmax(" not in body
        assert "relu(" not in src or "_0 > 0.0f ?" in body
    else:
        assert pointer not in body
        assert name == "maxpool" or "vload" in body
        assert "relu(" not in src or "fmax(" in body
    check_run(exe, seed=3)  # against numpy, outputs poisoned
