"""tfmlib.compiling (chapter 10): torch.compile where the platform can, the eager model and a reason
where it cannot; the first call's seconds reported either way."""

import os
import random
import shutil

import pytest
import torch

from tfmlib.compiling import CompileReport, compile_or_fallback

# TorchInductor's CPU backend writes C++ and builds it with the compiler named by $CXX (else g++ or
# clang++): without one, torch.compile fails at the first call, which is the fallback's case.
CXX = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("clang++")


def _tiny():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))


def _step(module):
    module(torch.ones(5, 4)).sum().backward()


def test_a_compiler_that_raises_falls_back_and_says_why():
    model = _tiny()

    def broken(m):
        raise RuntimeError("no C++ compiler found\nlong traceback ...")

    chosen, note = compile_or_fallback(model, _step, compiler=broken)
    assert chosen is model, "the eager model must be returned"
    assert isinstance(note, CompileReport) and not note.compiled
    assert str(note) == note.note == "eager (compile failed: RuntimeError: no C++ compiler found)", note
    assert note.error == "RuntimeError: no C++ compiler found" and note.seconds >= 0
    assert note.as_dict()["note"] == str(note)


def test_a_trial_that_fails_at_the_first_call_falls_back_with_clean_gradients():
    model = _tiny()

    def fails_late(m):
        _step(m)                                   # gradients accumulate, then the "compiled" call fails
        raise NotImplementedError()  # an error with no message

    chosen, note = compile_or_fallback(model, fails_late, compiler=lambda m: m)
    assert chosen is model and str(note).startswith("eager (compile failed: NotImplementedError:")
    assert "(no message)" in note.note, note
    assert all(p.grad is None for p in model.parameters()), "the trial's gradients must be cleared"


def test_a_working_compiler_is_kept_and_timed():
    model, seen = _tiny(), []
    wrapper = torch.nn.Sequential(model)

    def trial(m):
        seen.append(m)
        _step(m)

    chosen, note = compile_or_fallback(model, trial, compiler=lambda m: wrapper, device="cpu")
    assert chosen is wrapper and seen == [wrapper] and note.compiled and note.error is None
    assert str(note).startswith("compiled (first call ") and str(note).endswith(" s)"), note
    assert not isinstance(note, str), "a report, not a string with attributes"
    assert all(p.grad is None for p in model.parameters()), "the trial's gradients must be cleared"
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        compile_or_fallback("model", trial)
    with pytest.raises(TypeError, match="trial must be callable"):
        compile_or_fallback(model, None)


@pytest.mark.skipif(CXX is None, reason="no C++ compiler ($CXX, g++ or clang++): TorchInductor cannot build "
                                        "CPU kernels here, and the fallback tests above cover that case")
def test_a_real_compile_of_a_tiny_module():
    model = _tiny()
    chosen, note = compile_or_fallback(model, _step)
    assert note.compiled, f"torch.compile failed although {CXX} exists: {note}"
    assert chosen is not model and note.seconds > 0
    x = torch.randn(3, 4)
    torch.testing.assert_close(chosen(x), model(x)), "the compiled module must compute the same"
    assert set(dict(chosen.named_parameters())) == {f"_orig_mod.{n}" for n, _ in model.named_parameters()}
    assert next(chosen.parameters()) is next(model.parameters()), "the compiled module shares the weights"


@pytest.mark.parametrize("works", [True, False])
def test_the_trial_leaves_the_random_generators_as_they_were(works):
    """A trial step with dropout draws random numbers; the run after compile_or_fallback must draw
    the ones an eager run from the same seed draws (compiled or fallen back)."""
    def trial(m):
        torch.nn.functional.dropout(torch.ones(100), 0.5)
        random.random()
        _step(m)
        if not works:
            raise RuntimeError("no compiler here")

    model = _tiny()
    torch.manual_seed(11)
    random.seed(11)
    expected = (torch.rand(4), random.random())
    torch.manual_seed(11)
    random.seed(11)
    _, note = compile_or_fallback(model, trial, compiler=lambda m: m)
    assert note.compiled is works, note
    got = (torch.rand(4), random.random())
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1], "the trial's draws leaked into the run"
