"""Type stubs of the bitrefit extension module (python/src). Kept in step with the module by
tests/python/test_stubs.py (every public name and every parameter name)."""
import os
from typing import Any, Callable, Literal, Mapping, Optional, Union

__version__: str

# A tensor argument: a CPU torch.Tensor, a numpy array, any buffer or DLPack producer, or a
# with_dtype(...) reinterpretation. Read (Sender, digest) or written in place (Receiver).
Tensor = Any
StateDict = Mapping[str, Union[Tensor, "TypedTensor"]]
PathLike = Union[str, os.PathLike]
Progress = Callable[[str, int, int], None]
Gate = Literal["sync", "async"]

# ---- errors ------------------------------------------------------------------------------------

class Error(Exception):
    """Base of every bitrefit failure."""

    errc: Optional[str]  # 'invalid_argument', 'io', 'format', 'integrity', 'mismatch', 'protocol', 'fenced', 'unsupported'
    message: Optional[str]  # the description without the location prefix
    file: Optional[str]
    tensor: Optional[str]
    field: Optional[str]
    problem: Optional[str]  # the safetensors rule a checkpoint broke (e.g. 'offsets_overlap'), else None

class InvalidArgumentError(Error, ValueError): ...
class IoError(Error, OSError): ...
class FormatError(Error, ValueError): ...
class IntegrityError(Error): ...
class MismatchError(Error, ValueError): ...
class ProtocolError(Error): ...
class FencedError(Error): ...
class UnsupportedError(Error, ValueError): ...

# ---- tensors -----------------------------------------------------------------------------------

class TypedTensor:
    """A tensor whose bytes are read as another dtype of the same element size (from with_dtype)."""

    @property
    def tensor(self) -> Tensor: ...
    @property
    def dtype(self) -> str: ...

def with_dtype(tensor: Tensor, dtype: str) -> TypedTensor:
    """Declares that `tensor`'s bytes hold `dtype` values ('BF16', 'F8_E4M3', 'bfloat16', ...); same element size."""

def dtypes() -> list[str]:
    """The dtypes a checkpoint (and so a refit) can carry, in safetensors spelling."""

# ---- checkpoint operations (the `bitrefit` CLI's, with the --json keys) -------------------------

def stat(old: PathLike, new: PathLike, *, zstd_level: int = 3, frame_bytes: int = 67108864, threads: int = 0,
         progress: Optional[Progress] = None) -> dict[str, Any]:
    """What a delta from OLD to NEW would cost: equal, tensors, total, payload, seconds."""

def diff(old: PathLike, new: PathLike, delta: PathLike, *, mode: Literal["xor", "overwrite"] = "xor", directory: bool = False,
         zstd_level: int = 3, frame_bytes: int = 67108864, threads: int = 0,
         progress: Optional[Progress] = None) -> dict[str, Any]:
    """Writes the delta bundle OLD -> NEW atomically: delta, base_digest, target_digest, changed, frames, ..."""

def apply(base: PathLike, delta: PathLike, out: Optional[PathLike] = None, *, in_place: bool = False,
          progress: Optional[Progress] = None) -> dict[str, Any]:
    """Rebuilds DELTA's target from BASE into OUT (or over BASE), atomically: base_digest, target_digest, ..."""

def verify(a: PathLike, b: PathLike, *, limit: int = 5, progress: Optional[Progress] = None) -> dict[str, Any]:
    """Compares every stored bit: equal, a_digest, b_digest, differing_tensors, differences."""

def digest(checkpoint: Union[PathLike, StateDict], *, progress: Optional[Progress] = None) -> dict[str, Any]:
    """The attestation digest of a checkpoint path or of in-memory tensors: digest, tensors, elements, bytes."""

# ---- refits --------------------------------------------------------------------------------------

class Sender:
    """The trainer side of bit-exact delta refits (coordinator + owners) over a deployment directory."""

    def __init__(self, state_dict: StateDict, directory: PathLike, *, receivers: int, owners: int = 1, threads: int = 2,
                 gate: Gate = "sync", frame_bytes: int = 8388608, zstd_level: int = 3, attest: bool = True,
                 deadline: float = 5.0, serve_in_background: bool = True) -> None: ...
    def refit(self, state_dict: Optional[StateDict] = None) -> dict[str, Any]:
        """One transition K.v -> K.v+1 to its commit; its statistics (phases_s per phase, payload_bytes, ...)."""
    def wait_for_receivers(self, timeout: float = 60.0) -> bool: ...
    def pump(self, seconds: float) -> None: ...
    @property
    def version(self) -> int: ...
    @property
    def manifest(self) -> list[dict[str, Any]]: ...
    @property
    def directory(self) -> os.PathLike: ...
    @property
    def receivers(self) -> int: ...
    @property
    def gate(self) -> str: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Sender": ...
    def __exit__(self, *args: Any) -> None: ...

class ServingBlock:
    """Context manager returned by Receiver.serving()."""

    def __enter__(self) -> None: ...
    def __exit__(self, *args: Any) -> None: ...

class Receiver:
    """One rollout engine's side: refits are written in place into its own tensors."""

    def __init__(self, state_dict: StateDict, directory: PathLike, *, index: int, gate: Optional[Gate] = None,
                 attest: bool = True, deadline: float = 5.0, on_gate: Optional[Callable[[bool], None]] = None,
                 drain: Optional[Callable[[], None]] = None, on_commit: Optional[Callable[[int], None]] = None) -> None: ...
    def start(self, *, background: bool = False, timeout: float = 60.0) -> None: ...
    def step(self, timeout: float = 0.005) -> None: ...
    def wait(self, version: Optional[int] = None, timeout: Optional[float] = None) -> bool: ...
    def serving(self, timeout: Optional[float] = None) -> ServingBlock: ...
    def stats(self) -> dict[str, Any]: ...
    def attest(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def index(self) -> int: ...
    @property
    def directory(self) -> os.PathLike: ...
    @property
    def gate_open(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Receiver": ...
    def __exit__(self, *args: Any) -> None: ...
