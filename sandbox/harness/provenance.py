"""What a forward call actually ran: the ATen ops it dispatched and the candidate's own kernel launches.

The controller compares both with the reference's ops to find library fallbacks: a candidate that launches no
kernel of its own, or that calls the reference's library ops beside a token kernel of its own.
Launch counting hooks the three candidate backends: Triton (compiled or interpreted), CuPy RawKernel, and
extension modules built by torch.utils.cpp_extension.load_inline / load.
"""

from __future__ import annotations

import functools

# ATen ops that allocate, move or re-view data: allowed to anyone, never evidence of a library fallback.
DATA_OPS = frozenset("""
empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like ones ones_like full full_like new_zeros
new_ones new_full fill_ zero_ view _unsafe_view reshape _reshape_alias as_strided contiguous clone copy_ _to_copy to
t transpose permute expand expand_as select slice unsqueeze squeeze detach alias stack cat split split_with_sizes
chunk unbind narrow lift_fresh resize_ set_ unfold flatten view_as_real view_as_complex _local_scalar_dense
item is_nonzero size stride numel dim arange record_stream
""".split())


class Launches:
    """Counts the candidate's own kernel launches while `active`."""

    def __init__(self):
        self.count = 0
        self.active = False

    def hit(self) -> None:
        if self.active:
            self.count += 1

    def install(self) -> None:
        """Wrap the launch paths; called before the candidate is imported (so load_inline is wrapped too)."""
        try:
            import triton.runtime.interpreter as interp
            import triton.runtime.jit as jit

            for cls in (jit.JITFunction, interp.InterpretedFunction):
                cls.run = self._counting(cls.run)
        except ImportError:
            pass
        try:
            import cupy
        except ImportError:
            cupy = None
        if cupy is not None:
            self._install_cupy(cupy)  # Cython classes: counted through subclasses, see below
        import torch.utils.cpp_extension as ext

        for name in ("load_inline", "load"):
            original = getattr(ext, name)
            setattr(ext, name, self._wrapping_modules(original))

    def _install_cupy(self, cupy) -> None:
        """CuPy's kernel types are Cython classes (their methods cannot be patched): put counting subclasses in their
        place. Kernels fetched from a RawModule are counted through the module's get_function."""
        launches = self

        class CountingRawKernel(cupy.RawKernel):
            def __call__(self, *args, **kwargs):
                launches.hit()
                return super().__call__(*args, **kwargs)

        class CountingRawModule(cupy.RawModule):
            def get_function(self, name):
                kernel = super().get_function(name)
                return launches._counting(kernel)

        for name, cls in (("RawKernel", CountingRawKernel), ("RawModule", CountingRawModule)):
            setattr(cupy, name, cls)
        for name in ("ElementwiseKernel", "ReductionKernel"):
            base = getattr(cupy, name)
            setattr(cupy, name, type(name, (base,), {"__call__": _counting_call(base, self)}))

    def _counting(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            self.hit()
            return fn(*args, **kwargs)

        return wrapper

    def _wrapping_modules(self, build):
        @functools.wraps(build)
        def wrapper(*args, **kwargs):
            return _CountingModule(build(*args, **kwargs), self)

        return wrapper


def _counting_call(base, launches: Launches):
    def __call__(self, *args, **kwargs):
        launches.hit()
        return base.__call__(self, *args, **kwargs)

    return __call__


class _CountingModule:
    """An extension module whose functions count as the candidate's own kernels when called."""

    def __init__(self, module, launches: Launches):
        self._module, self._launches = module, launches

    def __getattr__(self, name):
        value = getattr(self._module, name)
        if callable(value):
            launches = self._launches

            @functools.wraps(value)
            def call(*args, **kwargs):
                launches.hit()
                return value(*args, **kwargs)

            return call
        return value


def record_ops(fn, *args) -> tuple[object, list[str]]:
    """Call fn(*args) and return (result, sorted names of the ATen ops it dispatched)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class Recorder(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            # Otherwise defining the mode wraps it in torch._disable_dynamo, whose first use imports Dynamo (and
            # sympy): seconds of a candidate's measuring turn, for a mode that never meets torch.compile.
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Recorder():
        result = fn(*args)
    return result, sorted(seen)


def compute_ops(ops: list[str]) -> set[str]:
    return {op for op in ops if op not in DATA_OPS}
