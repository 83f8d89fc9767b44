"""Study scenarios: a TOML file naming what to compare (variants), under which traffic, faults and seeds.

`parse` checks everything the file says before anything starts (every variant's topology is built, every
pattern's parameters and every trace file checked, every fault's link or switch looked up in every fabric) and
returns the resolved Scenario, which carries the fabrics it built. It asks nothing of this machine: what the
machine must offer (kernel features, a switch daemon per plane) is emulator.study.runner.runnable's pass, which
names the same lines (Scenario.error). Each mistake is a one-line UserError naming file, line and dotted field
(`variants[2].entropy`); tomllib keeps no positions, so emulator.study.positions finds the lines in the text.
"""

from __future__ import annotations

import dataclasses
import re
import reprlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controllers.apps import BUILTIN_APPS
from emulator.model import topologies
from emulator.model.capture import MIN_SNAPLEN, CaptureOptions, interfaces
from emulator.model.errors import UserError, read_file
from emulator.model.fabric import DIRECTIONS, Fabric
from emulator.model.faults import ARGUMENTS, FAULTS, Fault
from emulator.model.records import to_json
from emulator.model.servers import Server, external_target, parse_servers
from emulator.model.topologies import QUEUEING
from emulator.study.positions import Key, Positions, field_name
from traffic import patterns, traces
from traffic.options import TransportOptions

STUDIES_DIR = Path(__file__).parent / "builtin"
MAX_SEED = 2**32 - 1
MAX_TIMEOUT_S = 86_400.0
MAX_START_S = 1e6   # as the patterns' start_s
MAX_PLANE = 255

# The keys each table takes.
TOP_KEYS = ("name", "question", "focus", "seeds", "timeout_s", "topology", "traffic", "variants", "faults",
            "capture", "capture_bytes", "controller", "servers", "ssh_config", "quick")
TRAFFIC_KEYS = ("pattern", "params", "start_s", "trace", "format", "comm_groups")
VARIANT_KEYS = ("name", "app", "queueing", "traffic", "optional", "topology",
                *(f.name for f in TransportOptions.user_fields()))
FAULT_KEYS = ("at_s", "action", *ARGUMENTS)
QUICK_KEYS = ("seeds", "timeout_s", "topology", "traffic_scale", "variants")

_VARIANT_NAME = re.compile(r"[A-Za-z0-9_-]+")
_TOML_WHERE = re.compile(r" \(at (?:line (\d+), column (\d+)|end of document)\)$")


@dataclass(frozen=True)
class TrafficItem:
    """One source of messages: a pattern and its checked parameters, or a trace file. `format` is the trace's
    format (resolved from the file name when the scenario says auto); pattern items keep "auto". `comm_groups`:
    a Chakra trace's communicator-group file."""

    pattern: str | None
    params: dict
    trace: Path | None
    format: str
    start_s: float
    comm_groups: Path | None = None


@dataclass(frozen=True)
class Variant:
    """One configuration to compare. `app` is a built-in app name or the resolved path of a .py app;
    `topology` is the merged builder parameters ([topology], then the variant's, then --quick's), with "topo"."""

    name: str
    app: str
    options: TransportOptions  # the user's fields, checked; what the fabric decides is left to run time
    queueing: str
    traffic: tuple[int, ...] | None  # indices of the [[traffic]] items this variant runs; None: all
    optional: bool  # skipped, with the reason, on a machine that cannot run it (e.g. no RED for ECN)
    topology: dict


@dataclass(frozen=True)
class Scenario:
    """A checked scenario, with --quick already applied when `quick` is set."""

    name: str
    question: str
    source: str
    seeds: tuple[int, ...]
    timeout_s: float | None
    traffic: tuple[TrafficItem, ...]
    variants: tuple[Variant, ...]
    faults: tuple[Fault, ...]
    traffic_scale: float
    quick: bool
    focus: str = ""  # the traffic tag the answer follows (a victim flow), as the report names it
    capture: CaptureOptions | None = None  # pcaps of every run (emulator.net.capture)
    controller: str = ""  # tcp:HOST:PORT: every variant's switches use this controller of the user's, not `app`
    servers: tuple[Server, ...] = ()  # every run's planes spread over these (emulator.net.cluster)
    ssh_config: Path | None = None  # an ssh configuration file for them
    # each variant's fabric, built once by the checker (at the lowest rate auto may choose, with link_mbps auto),
    # and the scenario's text, for errors found later that name its lines; neither goes into to_dict
    fabrics: dict[str, Fabric] = field(default_factory=dict, repr=False, compare=False, metadata={"internal": True})
    text: str = field(default="", repr=False, compare=False, metadata={"internal": True})

    def to_dict(self) -> dict[str, Any]:
        """The resolved scenario as JSON-able data (paths as strings), for the run directory."""
        return {f.name: to_json(getattr(self, f.name)) for f in dataclasses.fields(self)
                if not f.metadata.get("internal")}

    def error(self, key: Key, message: str) -> UserError:
        """A mistake found after the check (by the machine's pass, emulator.study.runner.runnable), on its line."""
        return UserError(message, file=self.source, line=Positions(self.text).line(key) if self.text else None,
                         field=field_name(key) or None)




def variant_fabric(topology: dict[str, Any], mbps: float = topologies.AUTO_RATES[0]) -> Fabric:
    """A variant's fabric; with link_mbps = "auto", at `mbps` (the lowest rate auto may choose until run_study
    has chosen)."""
    params = dict(topology)
    if params.get("link_mbps") == "auto":
        params["link_mbps"] = mbps
    elif isinstance(params.get("link_mbps"), str):
        raise UserError(f"must be a rate in Mbit/s or \"auto\", got {_show(params['link_mbps'])}", field="link_mbps")
    return topologies.build(**params)


def builtin_names() -> list[str]:
    """The scenarios shipped in emulator/study/builtin/."""
    return sorted(p.stem for p in STUDIES_DIR.glob("*.toml"))


def load(name_or_path: str, quick: bool = False) -> Scenario:
    """A built-in scenario by name, or a scenario file (relative paths in it are relative to the file)."""
    if name_or_path in builtin_names():
        path = STUDIES_DIR / f"{name_or_path}.toml"
    else:
        path = Path(name_or_path)
        if path.suffix != ".toml" and not _is_file(path):
            raise UserError(f"unknown scenario {name_or_path!r} (built in: {', '.join(builtin_names())}; "
                            "or a path to a .toml file)")
    return parse(read_file(path, "scenario file"), str(path), path.parent, quick)


def parse(text: str, source: str, base_dir: Path, quick: bool = False) -> Scenario:
    """Check a scenario's text (`source` names it in errors; relative paths start at `base_dir`)."""
    return _Checker(source, text, base_dir, quick).scenario(_toml(text, source), Path(source).stem)


def _toml(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        where = _TOML_WHERE.search(message)
        if where is None:
            raise UserError(f"invalid TOML: {message}", file=source) from None
        line = int(where[1]) if where[1] else text.count("\n") + 1
        column = f" (column {where[2]})" if where[2] else ""
        raise UserError(f"invalid TOML: {message[:where.start()]}{column}", file=source, line=line) from None
    except RecursionError:
        raise UserError("invalid TOML: nested too deeply", file=source) from None


# -- checking ----------------------------------------------------------------------------------------------
class _Missing:
    def __repr__(self) -> str:
        return "nothing"


_MISSING = _Missing()


def _show(value: Any) -> str:
    """A value for a one-line message, shortened."""
    return reprlib.repr(value)


def _resolve(base_dir: Path, name: str) -> Path | None:
    """`name` relative to `base_dir`, or None when no file can have that name (a NUL byte)."""
    try:
        return (base_dir / name).resolve()
    except (OSError, ValueError):
        return None


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for the file system is just not a file
        return False


def _some(names: list[str], count: int = 8) -> str:
    return ", ".join(names[:count]) + (", ..." if len(names) > count else "")


class _Checker:
    """Checks a parsed document, raising UserErrors that point at the file, line and field."""

    def __init__(self, source: str, text: str, base_dir: Path, quick: bool) -> None:
        self.source = source
        self.text = text
        self.base_dir = base_dir
        self.quick = quick
        self._lines: Positions | None = None

    def error(self, key: Key, message: str) -> UserError:
        if self._lines is None:  # only a scenario with a mistake pays for the scan
            self._lines = Positions(self.text)
        return UserError(message, file=self.source, line=self._lines.line(key), field=field_name(key) or None)

    # -- values --------------------------------------------------------------------------------------
    def table(self, value: Any, key: Key, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(key, f"must be a table, got {_show(value)}")
        for name in value:
            if name not in allowed:
                raise self.error(key + (name,), f"unknown key (allowed here: {', '.join(allowed)})")
        return value

    def tables(self, value: Any, key: Key, allowed: tuple[str, ...], at_least: int) -> list[dict[str, Any]]:
        if not isinstance(value, list) or len(value) < at_least:
            amount = "one or more" if at_least else "a list of"
            raise self.error(key, f"must be {amount} [[{field_name(key)}]] tables, got {_show(value)}")
        return [self.table(item, key + (i,), allowed) for i, item in enumerate(value)]

    def string(self, value: Any, key: Key) -> str:
        if not isinstance(value, str) or not value or not value.isprintable():
            raise self.error(key, f"must be a non-empty one-line string, got {_show(value)}")
        return value

    def boolean(self, value: Any, key: Key) -> bool:
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {_show(value)}")
        return value

    def choice(self, value: Any, key: Key, choices: tuple[str, ...]) -> str:
        if not isinstance(value, str) or value not in choices:
            raise self.error(key, f"must be one of {', '.join(choices)}, got {_show(value)}")
        return value

    def integer(self, value: Any, key: Key, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.error(key, f"must be a whole number from {low} to {high}, got {_show(value)}")
        return value

    def number(self, value: Any, key: Key, low: float, high: float) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise self.error(key, f"must be a number from {low:g} to {high:g}, got {_show(value)}")
        return float(value)

    def seeds(self, value: Any, key: Key) -> tuple[int, ...]:
        if not isinstance(value, list) or not value:
            raise self.error(key, f"must be a non-empty list of seeds such as [1, 2, 3], got {_show(value)}")
        seeds = tuple(self.integer(seed, key + (i,), 0, MAX_SEED) for i, seed in enumerate(value))
        if len(set(seeds)) != len(seeds):
            raise self.error(key, f"must be distinct (each seed names a run directory), got {_show(value)}")
        return seeds

    def topology(self, value: Any, key: Key) -> dict[str, Any]:
        """Builder parameters: names and ranges are the builder's to check when the variants are built."""
        if not isinstance(value, dict):
            raise self.error(key, f"must be a table of topology parameters such as {{ nodes = 8 }}, got {_show(value)}")
        for name, item in value.items():
            if not isinstance(item, (str, int, float, bool)):
                raise self.error(key + (name,), f"must be a number, true/false or a string, got {_show(item)}")
        return value

    # -- the document ---------------------------------------------------------------------------------
    def scenario(self, doc: dict[str, Any], default_name: str) -> Scenario:
        self.table(doc, (), TOP_KEYS)
        self.doc = doc
        name = self.string(doc["name"], ("name",)) if "name" in doc else default_name
        question = self.string(doc["question"], ("question",)) if "question" in doc else ""
        focus = self.string(doc["focus"], ("focus",)) if "focus" in doc else ""
        capture = self.capture(doc)
        controller = self.string(doc["controller"], ("controller",)) if "controller" in doc else ""
        if controller:
            try:
                external_target(controller)
            except UserError as exc:
                raise self.error(("controller",), exc.message) from None
        servers, ssh_config = self.servers(doc)
        seeds = self.seeds(doc.get("seeds", [1]), ("seeds",))
        timeout_s = self.number(doc["timeout_s"], ("timeout_s",), 1, MAX_TIMEOUT_S) if "timeout_s" in doc else None
        quick = self.table(doc.get("quick", {}), ("quick",), QUICK_KEYS)
        base = self.topology(doc.get("topology", {}), ("topology",))
        traffic = tuple(self.traffic(item, ("traffic", i))
                        for i, item in enumerate(self.tables(doc.get("traffic", _MISSING), ("traffic",),
                                                             TRAFFIC_KEYS, 1)))
        variants = self.variants(doc.get("variants", _MISSING))
        faults = self.tables(doc.get("faults", []), ("faults",), FAULT_KEYS, 0)

        quick_seeds = self.seeds(quick["seeds"], ("quick", "seeds")) if "seeds" in quick else seeds
        quick_timeout = (self.number(quick["timeout_s"], ("quick", "timeout_s"), 1, MAX_TIMEOUT_S)
                         if "timeout_s" in quick else timeout_s)
        quick_scale = self.number(quick.get("traffic_scale", 1.0), ("quick", "traffic_scale"), 1e-6, 1e3)
        quick_topology = self.topology(quick.get("topology", {}), ("quick", "topology"))
        kept = self.kept_variants(quick.get("variants"), [v[1]["name"] for v in variants])
        if self.quick:
            seeds, timeout_s = quick_seeds, quick_timeout
            variants = [v for v in variants if kept is None or v[1]["name"] in kept]

        built: list[Variant] = []
        fabrics: dict[str, Fabric] = {}
        for i, fields in variants:
            layers = [(("topology",), base), (("variants", i, "topology"), fields.pop("topology"))]
            if fields["queueing"] != "fifo":  # switch queues are a property of the fabric the variant builds
                layers.append((("variants", i), {"queueing": fields["queueing"]}))
            if self.quick:
                layers.append((("quick", "topology"), quick_topology))
            merged, fabrics[fields["name"]] = self.fabric(layers)
            if capture and capture.ports:  # names the capture cannot find fail now, with their line
                try:
                    interfaces(fabrics[fields["name"]], capture.ports)
                except UserError as exc:
                    raise self.error(("capture",), exc.message) from None
            built.append(Variant(topology=merged, **fields))
        return Scenario(name=name, question=question, source=self.source, seeds=seeds, timeout_s=timeout_s,
                        traffic=traffic, variants=tuple(built),
                        faults=tuple(self.fault(item, ("faults", i), fabrics) for i, item in enumerate(faults)),
                        traffic_scale=quick_scale if self.quick else 1.0, quick=self.quick, focus=focus,
                        capture=capture, controller=controller, servers=servers, ssh_config=ssh_config,
                        fabrics=fabrics, text=self.text)

    def servers(self, doc: dict[str, Any]) -> tuple[tuple[Server, ...], Path | None]:
        """servers = ["localhost", "root@gpu2"]; ssh_config, a file relative to the scenario."""
        ssh_config = None
        if "ssh_config" in doc:
            path = _resolve(self.base_dir, self.string(doc["ssh_config"], ("ssh_config",)))
            if path is None or not _is_file(path):
                raise self.error(("ssh_config",), f"no such ssh configuration file relative to {self.base_dir}")
            ssh_config = path
        if "servers" not in doc:
            return (), ssh_config
        value = doc["servers"]
        if not isinstance(value, list) or not value:
            raise self.error(("servers",), f"must be a list such as [\"localhost\", \"root@gpu2\"], got {_show(value)}")
        try:
            servers = tuple(parse_servers(value))
        except UserError as exc:
            raise self.error(("servers",), exc.message) from None
        if not any(server.local for server in servers):
            raise self.error(("servers",), "list localhost among them: this machine runs the controller")
        return servers, ssh_config

    def capture(self, doc: dict[str, Any]) -> CaptureOptions | None:
        """capture = true (the hosts' NICs) or a list of interfaces and nodes; capture_bytes per frame."""
        value = doc.get("capture", False)
        snaplen = self.integer(doc.get("capture_bytes", MIN_SNAPLEN), ("capture_bytes",), MIN_SNAPLEN, 65535)
        if value is True:
            return CaptureOptions(None, snaplen)
        if value is False:
            return None
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise self.error(("capture",), f"must be true, false or a list of interfaces and nodes, got {_show(value)}")
        return CaptureOptions(tuple(value), snaplen)

    def traffic(self, item: dict[str, Any], key: Key) -> TrafficItem:
        if ("pattern" in item) == ("trace" in item):
            raise self.error(key, 'needs exactly one of pattern = "<name>" or trace = "<file>"')
        start_s = self.number(item.get("start_s", 0.0), key + ("start_s",), 0, MAX_START_S)
        if "pattern" in item:
            for only in ("format", "comm_groups"):
                if only in item:
                    raise self.error(key + (only,), f"only a trace item takes {only}")
            pattern = self.choice(item["pattern"], key + ("pattern",), tuple(patterns.PATTERNS))
            params = item.get("params", {})
            if not isinstance(params, dict):
                raise self.error(key + ("params",),
                                 f"must be a table of pattern parameters such as {{ size = 1048576 }}, "
                                 f"got {_show(params)}")
            if "start_s" in params:
                raise self.error(key + ("params", "start_s"), "set the item's start_s instead")
            try:
                params = patterns.check_params(pattern, params)
            except UserError as exc:
                raise self.error(key + ("params", exc.field), exc.message) from None
            return TrafficItem(pattern=pattern, params=params, trace=None, format="auto", start_s=start_s)
        if "params" in item:
            raise self.error(key + ("params",), "only a pattern item takes params")
        name = self.string(item["trace"], key + ("trace",))
        fmt = self.choice(item.get("format", "auto"), key + ("format",), traces.FORMATS)
        path = _resolve(self.base_dir, name)
        if path is None or not (_is_file(path) or _is_file(Path(f"{path}.0.et"))):
            raise self.error(key + ("trace",), f"no such trace file (or Chakra prefix) {name!r} "
                                               f"relative to {self.base_dir}")
        if fmt == "auto":
            try:
                fmt = traces.detect(path)
            except UserError:
                raise self.error(key + ("format",), f"cannot tell the format of {path.name} from its name: set "
                                                    f"format to one of {', '.join(traces.FORMATS[1:])}") from None
        if fmt == "pcap":  # packets, not messages: `mpft replay` sends those, a study cannot compare them
            raise self.error(key + ("format",), "a pcap is replayed as packets (mpft replay), not as messages; "
                                                "studies take jsonl, hpcc or chakra traces")
        groups = None
        if "comm_groups" in item:
            name = self.string(item["comm_groups"], key + ("comm_groups",))
            groups = _resolve(self.base_dir, name)
            if fmt != "chakra":
                raise self.error(key + ("comm_groups",), f"only a Chakra trace has process groups, this is {fmt}")
            if groups is None or not _is_file(groups):
                raise self.error(key + ("comm_groups",), f"no such file {name!r} relative to {self.base_dir}")
        return TrafficItem(pattern=None, params={}, trace=path, format=fmt, start_s=start_s, comm_groups=groups)

    def variants(self, value: Any) -> list[tuple[int, dict[str, Any]]]:
        """(index in the file, Variant fields with the variant's own topology overrides)."""
        out: list[tuple[int, dict[str, Any]]] = []
        seen: set[str] = set()
        for i, item in enumerate(self.tables(value, ("variants",), VARIANT_KEYS, 1)):
            key: Key = ("variants", i)
            name = item.get("name", _MISSING)
            if not isinstance(name, str) or not _VARIANT_NAME.fullmatch(name):
                raise self.error(key + ("name",), f"must be a name of letters, digits, - and _, got {_show(name)}")
            if name in seen:
                raise self.error(key + ("name",), f"another variant is already named {name!r}; names must be unique")
            seen.add(name)
            out.append((i, {
                "name": name,
                "app": self.app(item.get("app", _MISSING), key + ("app",)),
                "options": TransportOptions(**self.transport(item, key)),
                "traffic": self.traffic_subset(item.get("traffic"), key + ("traffic",)),
                "optional": self.boolean(item.get("optional", False), key + ("optional",)),
                "queueing": self.choice(item.get("queueing", "fifo"), key + ("queueing",), QUEUEING),
                "topology": self.topology(item.get("topology", {}), key + ("topology",)),
            }))
        return out

    def transport(self, item: dict[str, Any], key: Key) -> dict[str, Any]:
        """A variant's transport options, checked by the options' own table."""
        out: dict[str, Any] = {}
        for f in TransportOptions.user_fields():
            try:
                out[f.name] = TransportOptions.check_value(f.name, item.get(f.name, f.default),
                                                           out.get("transport", "rdma"))
            except UserError as exc:
                raise self.error(key + (f.name,), exc.message) from None
        return out

    def traffic_subset(self, value: Any, key: Key) -> tuple[int, ...] | None:
        if value is None:
            return None
        items = self.doc.get("traffic", [])
        count = len(items) if isinstance(items, list) else 0
        if not (isinstance(value, list) and value and all(isinstance(i, int) and not isinstance(i, bool)
                                                          and 0 <= i < count for i in value)):
            raise self.error(key, f"must be a non-empty list of [[traffic]] item numbers 0..{count - 1}, "
                                  f"got {_show(value)}")
        return tuple(sorted(set(value)))

    def app(self, value: Any, key: Key) -> str:
        if isinstance(value, str) and value in BUILTIN_APPS:
            return value
        if isinstance(value, str) and value.endswith(".py"):
            path = _resolve(self.base_dir, value)
            if path is None or not _is_file(path):
                raise self.error(key, f"no such controller app file {value!r} relative to {self.base_dir}")
            return str(path)
        raise self.error(key, f"must be a built-in app ({', '.join(BUILTIN_APPS)}) or a path to a .py file, "
                              f"got {_show(value)}")

    def kept_variants(self, value: Any, names: list[str]) -> set[str] | None:
        """quick.variants: which variants --quick keeps (None: all)."""
        if value is None:
            return None
        key: Key = ("quick", "variants")
        if not isinstance(value, list) or not value:
            raise self.error(key, f"must be a non-empty list of variant names, got {_show(value)}")
        for i, name in enumerate(value):
            if not isinstance(name, str) or name not in names:
                raise self.error(key + (i,), f"must be one of the variants ({', '.join(names)}), got {_show(name)}")
        return set(value)

    def fabric(self, layers: list[tuple[Key, dict[str, Any]]]) -> tuple[dict[str, Any], Fabric]:
        """Merge the topology layers (later ones win) and build the fabric. A builder's complaint is pinned on
        the layer that set the parameter, else on the most specific layer that sets anything."""
        merged: dict[str, Any] = {"topo": topologies.DEFAULT_TOPO}
        for _, layer in layers:
            merged.update(layer)
        fallback = next((key for key, layer in reversed(layers) if layer), layers[0][0])
        try:
            return merged, variant_fabric(merged)
        except UserError as exc:
            where = next((key for key, layer in reversed(layers) if exc.field in layer), fallback)
            raise self.error(where + ((exc.field,) if exc.field else ()), exc.message) from None
        except ValueError as exc:  # an interface name over Linux's limit, an address outside the plan
            raise self.error(fallback, f"cannot build this topology: {exc}") from None

    def fault(self, item: dict[str, Any], key: Key, fabrics: dict[str, Fabric]) -> Fault:
        at_s = self.number(item.get("at_s", _MISSING), key + ("at_s",), 0, MAX_START_S)
        action = self.choice(item.get("action", _MISSING), key + ("action",), tuple(FAULTS))
        needs = FAULTS[action]
        for other in ARGUMENTS:
            if other in item and other not in needs:
                raise self.error(key + (other,), f"{action} takes no {other}"
                                                 + (f" (it takes {', '.join(needs)})" if needs else ""))
        link = switch = None
        if "link" in needs:
            value = item.get("link", _MISSING)
            if not (isinstance(value, list) and len(value) == 2 and all(isinstance(n, str) for n in value)):
                raise self.error(key + ("link",), f'must be two node names such as ["p0l0", "p0s0"], '
                                                  f"got {_show(value)}")
            link = (value[0], value[1])
            for variant, fabric in fabrics.items():
                if not fabric.graph.has_edge(*link):
                    a, b = fabric.links("fabric")[0]
                    raise self.error(key + ("link",), f"no link {link[0]!r}-{link[1]!r} in the fabric of variant "
                                                      f"{variant} (give two adjacent nodes such as {a}-{b})")
        if "switch" in needs:
            switch = item.get("switch", _MISSING)
            if not isinstance(switch, str):
                raise self.error(key + ("switch",), f'must be a switch name such as "p0s0", got {_show(switch)}')
            for variant, fabric in fabrics.items():
                if switch not in fabric.switches():
                    raise self.error(key + ("switch",), f"no switch {switch!r} in the fabric of variant {variant} "
                                                        f"(switches: {_some(sorted(fabric.switches()))})")
        plane = None
        if "plane" in needs:
            plane = self.integer(item.get("plane", _MISSING), key + ("plane",), 0, MAX_PLANE)
            for variant, fabric in fabrics.items():
                if plane not in fabric.planes:
                    raise self.error(key + ("plane",), f"no plane {plane} in the fabric of variant {variant} "
                                                       f"(planes: {', '.join(map(str, fabric.planes))})")
        rate_fraction = direction = None
        if "rate_fraction" in needs:
            rate_fraction = self.number(item.get("rate_fraction", _MISSING), key + ("rate_fraction",), 0.001, 1)
            direction = self.choice(item.get("direction", "both"), key + ("direction",), DIRECTIONS)
        return Fault(at_s=at_s, action=action, link=link, switch=switch, plane=plane, rate_fraction=rate_fraction,
                     direction=direction)
