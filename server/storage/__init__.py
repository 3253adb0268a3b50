"""Holding storage: the devices that hold messages until they are delivered, and the layer that picks one."""
