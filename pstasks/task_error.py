"""The error of a task that cannot be loaded, apart from pstasks.tasks so that the modules the
built-in tasks are made of (pstasks.digits) can raise it without importing the tasks."""

from __future__ import annotations


class TaskError(ValueError):
    """A task name or ``module:function`` that cannot be loaded, or a built-in task whose data is missing."""
