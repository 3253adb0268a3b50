"""pymq: a JMS-style message broker and SDK speaking STOMP."""
__version__ = "0.1.0"
