"""Shard state, update rules and consistency policy. Pure torch: never imports grpc."""
