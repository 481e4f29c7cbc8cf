"""The gRPC transport: a thin servicer over psserver.core, plus health and reflection."""
