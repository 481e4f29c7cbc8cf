"""Built-in tasks, data sets and models for ``psworker train``, and the command itself.

They implement the :class:`psworker.task.Task` interface of the client library; the library
never imports them, so a worker that brings its own task installs no data-set code.
"""
