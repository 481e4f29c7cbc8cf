"""The hetps client library: PSClient, worker procedures, the optimizer wrapper, the Task interface."""
