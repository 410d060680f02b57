import pytest
import torch

collect_ignore_glob = ["data/*"]

# The tolerances in tests/device_tools.py assume full float32 matmuls on CUDA: TF32 (10-bit mantissa
# products, ~1e-3 relative) would need tolerances ten times looser. PyTorch's default keeps it off; the
# suite states its assumption explicitly rather than depend on the environment's default.
torch.set_float32_matmul_precision("highest")


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request) -> torch.device:
    """Run a test on each device: "cpu" always, "cuda" where a GPU is (the param carries the gpu mark, so
    pytest_collection_modifyitems skips it without one). Session-scoped, so that module-scoped fixtures
    (a model loaded once per module) can take it: pytest then builds them once per device."""
    return torch.device(request.param)


def _torch_globals() -> dict:
    """Process-wide torch settings that change numerics or where tensors go; one test must not leave them
    changed for the next (the suite runs in one process, on a GPU machine too)."""
    state = {"default dtype": torch.get_default_dtype(),
             "float32 matmul precision": torch.get_float32_matmul_precision(),
             "cuda matmul allow_tf32": torch.backends.cuda.matmul.allow_tf32,
             "deterministic algorithms": torch.are_deterministic_algorithms_enabled(),
             "grad enabled": torch.is_grad_enabled()}
    if hasattr(torch, "get_default_device"):
        state["default device"] = torch.get_default_device()
    return state


def _restore_torch_globals(state: dict):
    torch.set_default_dtype(state["default dtype"])
    torch.set_float32_matmul_precision(state["float32 matmul precision"])
    torch.backends.cuda.matmul.allow_tf32 = state["cuda matmul allow_tf32"]
    torch.use_deterministic_algorithms(state["deterministic algorithms"])
    torch.set_grad_enabled(state["grad enabled"])
    if "default device" in state:   # None removes the default-device mode (the state of a fresh process)
        dev = state["default device"]
        torch.set_default_device(None if dev == torch.device("cpu") else dev)


@pytest.fixture(autouse=True)
def _torch_globals_restored(request):
    """Puts back the settings of _torch_globals after each test and warns, naming the test, when one
    changed them: a later test would otherwise run with another dtype, device or matmul precision (on a
    GPU, TF32 changes float32 results by ~1e-3) and fail far from the cause."""
    before = _torch_globals()
    yield
    after = _torch_globals()
    if after != before:
        changed = {k: (before[k], after[k]) for k in before if before[k] != after.get(k)}
        _restore_torch_globals(before)
        import warnings
        warnings.warn(f"{request.node.nodeid} changed torch's global state {changed}; restored it",
                      UserWarning, stacklevel=1)
