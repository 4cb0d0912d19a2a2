"""bitrefit: bit-exact delta refit of model weights from RL trainers to rollout engines.

Each new policy version travels as only the elements whose stored bits changed, and every rollout
engine ends with exactly the bits a full copy would have given it. The trainer runs a Sender over
its exported state_dict; each rollout engine runs a Receiver over its model's own tensors, which
every refit rewrites in place:

    # trainer                                   # rollout engine (index i of N)
    sender = bitrefit.Sender(export(), DIR,     receiver = bitrefit.Receiver(model.state_dict(), DIR,
                             receivers=N)                                    index=i)
    for step in ...:                            receiver.start(background=True)
        train_step()                            while serving:
        stats = sender.refit(export())              with receiver.serving():
                                                        generate(model, ...)

Checkpoint operations (the `bitrefit` CLI's): stat, diff, apply, verify, digest. Tensors: CPU
torch tensors, numpy arrays, anything with the buffer protocol or DLPack; with_dtype() declares
bfloat16 / float8 bits held in same-size integer arrays. Every failure is a bitrefit.Error with
errc, file, tensor and field. See README.md (section "Python") and examples/python.
"""
from ._bitrefit import (  # noqa: F401
    Error,
    FencedError,
    FormatError,
    IntegrityError,
    InvalidArgumentError,
    IoError,
    MismatchError,
    ProtocolError,
    Receiver,
    Sender,
    ServingBlock,
    TypedTensor,
    UnsupportedError,
    __version__,
    apply,
    diff,
    digest,
    dtypes,
    stat,
    verify,
    with_dtype,
)

__all__ = [
    "Error", "FencedError", "FormatError", "IntegrityError", "InvalidArgumentError", "IoError", "MismatchError",
    "ProtocolError", "Receiver", "Sender", "ServingBlock", "TypedTensor", "UnsupportedError", "apply", "diff",
    "digest", "dtypes", "stat", "verify", "with_dtype",
]
