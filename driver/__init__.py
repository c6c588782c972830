"""Host driver: one API over the golden model, the RTL simulation and a serial-bridged board."""

from .runtime import DriverError, Job, JobError, LoadedModel, Npu, Priority, relocate
from .trace import Trace
from .transport import ModelTransport, Transport, TransportError

__all__ = [
    "DriverError", "Job", "JobError", "LoadedModel", "ModelTransport", "Npu", "Priority", "Trace",
    "Transport", "TransportError", "relocate",
]  # fmt: skip
