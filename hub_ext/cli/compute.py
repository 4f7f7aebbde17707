"""``labfleet image``: the images (environments) sessions start from.

Every change goes through :mod:`labfleet.compute.images`, like the REST API's.
"""

from __future__ import annotations

from typing import Any

from labfleet.cli.base import Command, Group, ListCommand, Option, check_slots, flag, split_list
from labfleet.cli.output import slots_text


class ImageRegister(Command):
    name = "labfleet image register"
    description = "Register an image (environment) that sessions may start."
    examples = (
        "labfleet image register repo/pytorch:2.5 --display-name 'PyTorch 2.5' --min cpu=1,mem=2g "
        "--accelerators cuda --ports tensorboard:http:6006 --projects acme/ml",
        "labfleet image register labfleet/singleuser:test --from-docker",
    )
    arguments = ("IMAGE",)
    options = (
        Option("--display-name", "The name people see on the spawn form.", metavar="TEXT"),
        Option(
            "--min", "Minimum resources of a session, e.g. cpu=1,mem=2g.", metavar="SLOTS", dest="min_slots"
        ),
        Option("--accelerators", "Accelerators it can use, comma-separated (cuda).", metavar="NAMES"),
        Option("--ports", "Service ports, name:protocol:port comma-separated.", metavar="PORTS"),
        Option(
            "--projects",
            "Only these projects (DOMAIN/PROJECT, comma-separated) may use it.",
            metavar="PROJECTS",
        ),
        Option("--domains", "Only these domains (comma-separated) may use it.", metavar="DOMAINS"),
        flag("--from-docker", "Read the image's ai.labfleet.* labels from the local Docker engine."),
    )

    def run(self) -> None:
        from labfleet.compute import images

        opts = self.opts
        body: dict[str, Any] = {"name": self.args[0]}
        if opts.display_name is not None:
            body["display_name"] = opts.display_name
        if opts.min_slots is not None:
            body["min_resource_slots"] = check_slots(opts.min_slots, "--min")
        for key, value in (
            ("accelerators", opts.accelerators),
            ("projects", opts.projects),
            ("domains", opts.domains),
            ("service_ports", opts.ports),
        ):
            if value is not None:
                body[key] = split_list([value])
        labels = images.docker_labels(body["name"]) if opts.from_docker else None
        view = self.transaction(lambda db: images.image_view(images.register(db, self.actor, body, labels)))
        self.out(f"Registered image {view['name']} ({view['display_name']}).")


def _image_row(v: dict[str, Any]) -> list[Any]:
    ports = ",".join(f"{p['name']}:{p['protocol']}:{p['port']}" for p in v["service_ports"])
    return [
        v["name"],
        v["display_name"],
        slots_text(v["min_resource_slots"]),
        ",".join(v["accelerators"]) or "-",
        ports or "-",
        ",".join(v["projects"] + v["domains"]) or "everyone",
    ]


class ImageList(ListCommand):
    name = "labfleet image list"
    description = "List the registered images."

    def run(self) -> None:
        from labfleet.compute import images

        views = self.transaction(
            lambda db: [images.image_view(i) for i in images.list_images(db, self.actor)]
        )
        self.emit(views, ["image", "display name", "min", "accelerators", "ports", "for"], _image_row)


class ImageRemove(Command):
    name = "labfleet image remove"
    description = "Remove an image from the registry; running sessions keep running."
    arguments = ("IMAGE",)

    def run(self) -> None:
        from labfleet.compute import images

        name = self.args[0]
        self.transaction(lambda db: images.remove(db, self.actor, name))
        self.out(f"Removed image {name}.")


IMAGE = Group(
    "labfleet image",
    "Manage images (environments).",
    {"register": ImageRegister, "list": ImageList, "remove": ImageRemove},
)
