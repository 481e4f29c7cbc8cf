"""The hetps wire contract: what both sides need to speak the protocol, and nothing else.

- ``v1``: the generated stubs of protos/psproto/v1 (the contract itself).
- ``codec`` (with ``dtypes``, ``blocks`` and ``wire``): tensors as chunks and the messages' framing.
- ``layout``: the model as named tensors in one flat vector, cut into shards.
- ``reasons`` and ``errors``: every refusal's machine-readable reason.
- ``metadata``: the call metadata keys servers send and workers read.

Three small modules stay here because both sides need them to speak the protocol alike:

- ``booleans``: how a boolean is spelled in the string-valued options on the wire (a rule's
  hyperparameters, the procedure options of a Join reply): the server writes and reads them,
  the worker reads them, and both must accept the same words.
- ``security``: a client's TLS and its bearer token, with the metadata key the server's
  interceptor checks; the worker and the server's own client commands (``psserver top``,
  the admin commands) connect with it, and ``psserver.rpc.security`` builds on it.
- ``inline_ops``: making and reading chunks on the thread that moves them; both sides copy
  every chunk of a push and a pull, and through torch's intra-op pool a step took up to 1.7 times
  as long (docs/performance.md), so the codec's callers on either side hold this guard.
"""
