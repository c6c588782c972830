"""Multi-stage inference pipelines: sources and data-loader workers, model runners on a
shared `Npu`, post-processors, joined by basic, sync and copy queues; described in Python or in a
YAML/JSON graph file (`npu pipeline run graph.yaml`)."""

from .frames import Frame, PipelineError, StageError
from .graph import load_graph
from .pipeline import Pipeline
from .queues import BasicQueue, CopyQueue, SyncQueue
from .report import Report
from .stages import ModelRunner, Source, Stage

__all__ = [
    "BasicQueue",
    "CopyQueue",
    "Frame",
    "ModelRunner",
    "Pipeline",
    "PipelineError",
    "Report",
    "Source",
    "Stage",
    "StageError",
    "SyncQueue",
    "load_graph",
]
