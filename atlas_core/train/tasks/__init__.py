"""Training tasks generated on the fly (no downloads): recall, copying, retrieval, text.

Each task turns a seeded ``torch.Generator`` into ``(inputs, targets)``, both LongTensor
``[B, T]``, with -100 (`IGNORE_INDEX`) wherever the loss does not count (see `base`).

========================  ==========================================================
``mqar``                  Zoology's multi-query associative recall
``copy``                  copy a random sequence after a separator
``selective_copy``        copy the data tokens scattered in a noisy span (Mamba)
``sniah``                 single needle in a haystack (RULER S-NIAH), any context length
``text``                  byte- or character-level language modelling on a text file
========================  ==========================================================
"""

from .base import (
    IGNORE_INDEX,
    Task,
    TaskDataError,
    TaskFileNotFoundError,
    masked_accuracy,
)
from .copy import CopyParams, CopyTask
from .mqar import MQARParams, MQARTask
from .selective_copy import SelectiveCopyParams, SelectiveCopyTask
from .sniah import SNIAHParams, SNIAHTask
from .text import TextParams, TextTask

TASKS: dict[str, type[Task]] = {
    "mqar": MQARTask,
    "copy": CopyTask,
    "selective_copy": SelectiveCopyTask,
    "sniah": SNIAHTask,
    "text": TextTask,
}

__all__ = [
    "IGNORE_INDEX", "TASKS", "CopyParams", "CopyTask", "MQARParams", "MQARTask",
    "SNIAHParams", "SNIAHTask", "SelectiveCopyParams", "SelectiveCopyTask", "Task",
    "TaskDataError", "TaskFileNotFoundError", "TextParams", "TextTask", "masked_accuracy",
]
