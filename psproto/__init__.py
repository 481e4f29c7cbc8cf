"""The hetps wire contract: generated stubs, the tensor codec and the model layout."""
