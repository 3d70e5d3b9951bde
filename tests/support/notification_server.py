"""A desktop notification server made by the tests, on a real D-Bus session bus.

It stands in for the desktop's own (GNOME Shell, KDE Plasma, dunst), which a
test machine has none of: it owns `org.freedesktop.Notifications` on the bus
named by DBUS_SESSION_BUS_ADDRESS and implements the methods of the
freedesktop Desktop Notifications Specification that clients call. Each
Notify call is appended to the JSON-lines file given as the first argument;
"ready" is printed once the name is owned. With `--click`, each notification
that has a default action is clicked (ActionInvoked "default") as it arrives.

    python -m tests.support.notification_server received.jsonl [--click]
"""

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated

from dbus_fast.aio import MessageBus
from dbus_fast.annotations import (
    DBusDict,
    DBusInt32,
    DBusSignature,
    DBusStr,
    DBusUInt32,
)
from dbus_fast.service import ServiceInterface, dbus_method, dbus_signal

NAME = "org.freedesktop.Notifications"
PATH = "/org/freedesktop/Notifications"


class Notifications(ServiceInterface):
    def __init__(self, received: Path, click: bool = False) -> None:
        super().__init__(NAME)
        self.received = received
        self.click = click
        self.last_id = 0

    @dbus_method()
    def Notify(self, app_name: DBusStr, replaces_id: DBusUInt32, app_icon: DBusStr,
               summary: DBusStr, body: DBusStr,
               actions: Annotated[list[str], DBusSignature("as")], hints: DBusDict,
               expire_timeout: DBusInt32) -> DBusUInt32:
        self.last_id += 1
        with open(self.received, "a", encoding="utf-8") as f:
            f.write(json.dumps({"id": self.last_id, "app_name": app_name, "summary": summary,
                                "body": body, "app_icon": app_icon,
                                "hints": sorted(hints), "actions": actions}) + "\n")
        if self.click and "default" in actions[::2]:  # after the answer, as a person would
            asyncio.get_running_loop().call_later(0.1, self.ActionInvoked, self.last_id,
                                                  "default")
        return self.last_id

    @dbus_method()
    def GetCapabilities(self) -> Annotated[list[str], DBusSignature("as")]:
        return ["body"]

    @dbus_method()
    def GetServerInformation(self) -> Annotated[
            tuple[str, str, str, str], DBusSignature("ssss")]:
        return ("agentbox-tests", "agentbox", "1.0", "1.2")

    @dbus_method()
    def CloseNotification(self, notification_id: DBusUInt32) -> None:
        self.NotificationClosed(notification_id, 3)

    @dbus_signal()
    def ActionInvoked(self, notification_id: DBusUInt32, action_key: DBusStr
                      ) -> Annotated[tuple[int, str], DBusSignature("us")]:
        return (notification_id, action_key)

    @dbus_signal()
    def NotificationClosed(self, notification_id: DBusUInt32, reason: DBusUInt32
                           ) -> Annotated[tuple[int, int], DBusSignature("uu")]:
        return (notification_id, reason)


async def serve(received: Path, click: bool) -> None:
    bus = await MessageBus().connect()
    bus.export(PATH, Notifications(received, click))
    await bus.request_name(NAME)
    print("ready", flush=True)
    await bus.wait_for_disconnect()


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1]), "--click" in sys.argv[2:]))
