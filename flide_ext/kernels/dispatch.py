"""Which implementation a kernel call runs, decided by the caller once.

Every public kernel function takes ``backend``: ``"triton"`` runs the Triton
kernel (where the op's contract allows it: some dtypes and sizes always take
the reference), ``"reference"`` the plain PyTorch reference, and None picks by
the input's device (Triton on CUDA, the reference elsewhere). A model decides
its backend once, when it is loaded (:meth:`flide_ext.models.base.FlatCausalLM.set_kernel_backend`),
so no call reads the environment. ``"triton"`` on CPU tensors runs the kernels
under the Triton interpreter (``TRITON_INTERPRET=1`` set before they are
imported), which is how the tests run them on a machine without a GPU.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Callable, Optional

import torch

BACKENDS = ("triton", "reference")
# Set (to anything but empty or 0) to make models load with the reference kernels.
REFERENCE_ENV = "FLIDE_REFERENCE_KERNELS"


def check_backend(backend: Optional[str]) -> None:
    """Raises ValueError unless ``backend`` is None or one of :data:`BACKENDS`."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"kernel backend {backend!r} is not one of {', '.join(BACKENDS)}")


def backend_for(x: torch.Tensor, backend: Optional[str]) -> str:
    """``backend`` when given, else ``"triton"`` for CUDA tensors and ``"reference"`` otherwise.

    Raises:
        ValueError: ``backend`` is not None or one of :data:`BACKENDS`.
    """
    if backend is None:
        return "triton" if x.is_cuda else "reference"
    check_backend(backend)
    return backend


def environment_backend() -> Optional[str]:
    """``"reference"`` when :data:`REFERENCE_ENV` asks for the references, else None
    (by device). Read once per model, when it is loaded."""
    return "reference" if os.environ.get(REFERENCE_ENV, "") not in ("", "0") else None


def reference_signature(reference: Callable) -> Callable:
    """Decorator of a public ``(*args, backend=None, **kwargs)`` function: gives it
    ``reference``'s signature plus the keyword ``backend`` (what ``help()`` and
    ``inspect.signature`` show), so the long argument lists are written once."""

    def decorate(public: Callable) -> Callable:
        signature = inspect.signature(reference)
        backend = inspect.Parameter("backend", inspect.Parameter.KEYWORD_ONLY, default=None)
        public.__signature__ = signature.replace(parameters=[*signature.parameters.values(), backend])
        return public

    return decorate


def checked_reference(public: Callable, reference: Callable) -> Callable:
    """``reference`` as an op package exports it: the public function with
    ``backend="reference"``, so its arguments are checked as the public
    function's (the leaf itself trusts its caller); same name, signature and
    docstring as the leaf."""

    @functools.wraps(reference)
    def checked(*args, **kwargs):
        return public(*args, backend="reference", **kwargs)

    return checked
