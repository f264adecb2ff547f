"""mqd: the Python client of the mqd message broker (standard library only).

    from mqd import Client

    with Client(["http://10.0.0.1:7070", "http://10.0.0.2:7070"]) as c:
        c.publish("orders", b"...", key="order-1001")
        with c.consumer("orders", "billing") as consumer:
            consumer.run(handle)   # until consumer.stop(), SIGINT or SIGTERM

See README.md and docs/clients.md for the rules it follows.
"""
from .client import (BatchMessage, Client, DeadLetter, DLQPage, Message, Output, ProcessResult, PublishResult,
                     ReceiptResult, ReplayResult)
from .consumer import Consumer
from .errors import MqdError, Reject, TransportError

__all__ = ["BatchMessage", "Client", "Consumer", "DeadLetter", "DLQPage", "Message", "MqdError", "Output",
           "ProcessResult", "PublishResult", "ReceiptResult", "Reject", "ReplayResult", "TransportError"]
__version__ = "0.1.0"
