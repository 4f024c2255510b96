"""The policy: a human-edited YAML file, loaded at task run time into frozen typed objects.

Every section below is a frozen dataclass; its fields are the YAML keys (``snake_case``, or the
same with dashes). The rules' sections (``rules:``) and the actions' (top-level keys such as
``demote:``) are declared by the rule and executor modules that own them (:class:`Rules`,
:class:`Actions`). The annotated reference is ``include/policy/default.yaml``; ``docs/reference/policy.md`` is generated
from this module (``python -m gpu_cost.cli.docgen``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import FrozenInstanceError, dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Literal

from gpu_cost.config.typed import SPREAD, Dur, OneOf, Range, Regex, build, mapping, unknown_key
from gpu_cost.core import registry
from gpu_cost.core.model import MODES

#: a policy mode, as the type checker knows it: :data:`gpu_cost.core.model.MODES` spelled out (a test holds them equal)
Mode = Literal["dry-run", "notify", "enforce"]
Level = Literal["never", "notify_only", "approval"]
Percent = Annotated[float, Range(0, 100)]
Seconds = Annotated[float, Dur(), Range(0, 366 * 86400)]
Share = Annotated[float, Range(0, 1)]
Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
#: a Slurm / Unix user name (the policy's user lists are checked against it)
USER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}\$?$")

#: the actions a rule's ladder may use: those the registry declares ``ladder=True``, mildest first
LADDER_ACTIONS = registry.names(ladder=True)
#: a ladder rung's action, checked against the registry when the policy is read
LadderAction = Annotated[str, OneOf(lambda: LADDER_ACTIONS)]


@dataclass(frozen=True)
class Rung:
    """One step of an escalation ladder: ``action`` once the previous rung is ``after`` old."""

    action: LadderAction
    after: Seconds = 0.0


@dataclass(frozen=True)
class SweepConfig:
    """How the sweep sees the cluster."""

    interval: Annotated[float, Dur(), Range(30, 86400)] = 300.0
    source: Literal["sim", "prometheus", "trace"] = "sim"
    sample_interval: Annotated[float, Dur(), Range(1, 3600)] = 60.0
    lookback: Annotated[float, Dur(), Range(300, 7 * 86400)] = 6 * 3600.0
    #: share of the expected samples a GPU must have in the window to count as seen
    min_sample_ratio: Annotated[float, Range(0.05, 1)] = 0.6
    #: the newest sample must be at most this old, or the GPU (and a whole source) is stale
    max_staleness: Annotated[float, Dur(), Range(1, 86400)] = 180.0
    #: utilisation % above which a sample counts as busy (bursts, busy share)
    busy_util: Percent = 20.0
    #: node groups the sweep collects and runs the rules in, each as its own mapped task (spread
    #: over the workers); one decision takes all their findings. 1: the whole cluster in one task
    shards: Annotated[int, Range(1, 1024)] = 1
    #: how long a run's parked state is kept: the snapshot, findings and plan each run of the sweep,
    #: power and manual-reclaim DAGs writes into the audit store for its own later tasks (about 1 MB a
    #: run per 1,000 GPUs). Once older than this, the end of each sweep and power run empties it (the
    #: decisions, actions and usage rows are history and stay). At least approval.timeout plus an hour:
    #: a run awaiting an answer reads its plan and snapshot when the answer comes
    keep_parked: Annotated[float, Dur(), Range(3600, 366 * 86400)] = 2 * 86400.0


class Sections(Mapping[str, Any]):
    """Settings sections declared by registered modules, keyed by name: a frozen mapping whose keys are
    the registered names (:meth:`configs`) and whose values are their dataclasses. A name the policy
    leaves out takes its dataclass's defaults. :class:`Rules` and :class:`Actions` are the two kinds."""

    __slots__ = ("_defaults", "_given")
    #: what one name is, as errors say it
    _what = "section"

    @classmethod
    def configs(cls) -> dict[str, type]:
        """The registered names, in order, and each one's dataclass."""
        raise NotImplementedError

    @classmethod
    def _path(cls, name: str) -> str:
        """Where section ``name`` is in the policy."""
        return name

    def __init__(self, sections: Mapping[str, Any] | None = None, /, **named: Any) -> None:
        given = {**(sections or {}), **named}
        if given:
            configs = self.configs()
            for name, cfg in given.items():
                config = configs.get(name)
                if config is None:
                    raise TypeError(f"no {self._what} {name!r} is registered (known: {', '.join(configs)})")
                if not isinstance(cfg, config):
                    raise TypeError(f"{self._path(name)} must be a {config.__name__}, got {type(cfg).__name__}")
        object.__setattr__(self, "_given", MappingProxyType(given))
        object.__setattr__(self, "_defaults", {})

    @classmethod
    def from_policy(cls, value: Any, source: str, path: str) -> Sections:
        """Build the sections from the policy's mapping ``value`` at ``path``; each one's keys are checked by
        its dataclass, and errors name ``<path>.<name>.<key>``."""
        raw = mapping(value, source, path)
        configs = cls.configs()
        aliases = {name.replace("_", "-"): name for name in configs}
        sections: dict[str, Any] = {}
        for key, data in raw.items():
            name = aliases.get(str(key), str(key))
            if name not in configs:
                raise unknown_key(source, path, str(key), configs)
            sections[name] = build(configs[name], data, source, f"{path}.{key}" if path else str(key))
        return cls(sections)

    def replace(self, **sections: Any) -> Sections:
        """Return a copy with ``sections`` (name → its dataclass) in place of the ones here."""
        return type(self)({**self._given, **sections})

    def __getitem__(self, name: str) -> Any:
        try:
            return self._given[name]
        except KeyError:
            pass
        config = self.configs().get(name)
        if config is None:
            raise KeyError(name)
        cfg = self._defaults.get(name)
        if type(cfg) is not config:
            cfg = self._defaults[name] = config()
        return cfg

    def __getattr__(self, name: str) -> Any:
        """``rules.zombie`` is ``rules["zombie"]``."""
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"no {self._what} {name!r}") from None

    def __iter__(self) -> Iterator[str]:
        names = list(self.configs())
        return iter(names + [n for n in self._given if n not in names])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sections) or type(other) is not type(self):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    def __hash__(self) -> int:
        return hash(tuple(self.items()))

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to {self._path(name)}: use .replace({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete {self._path(name)}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self._given),))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._given.items())})"


class Rules(Sections):
    """The rules' sections, one per registered rule, keyed by its name.

    Each rule's module declares its section's dataclass (``RuleSpec.config``: fields, defaults, the
    ladder's default) beside its detector; a rule the policy leaves out takes those defaults, and a
    rule a deployment adds (``GPU_COST_RULE_MODULES``) is a key like the shipped ones."""

    __slots__ = ()
    _what = "rule"

    @classmethod
    def configs(cls) -> dict[str, type]:
        return {name: spec.config for name, spec in registry.rules().items()}

    @classmethod
    def _path(cls, name: str) -> str:
        return f"rules.{name}"


class Actions(Sections):
    """The actions' settings: one top-level section of the policy per registered action that declares
    one (``demote:``), keyed by the section's name.

    Each executor module declares its section's dataclass (``ActionSpec.config``: fields, defaults)
    and its check beside the executor; an action a deployment adds (``GPU_COST_ACTION_MODULES``) with
    settings is a top-level key like ``demote``. Read one as ``policy.actions.demote``."""

    __slots__ = ()
    _what = "action section"

    @classmethod
    def configs(cls) -> dict[str, type]:
        return {name: spec.config for name, spec in registry.action_sections().items() if spec.config is not None}


@dataclass(frozen=True)
class Match:
    """What a protection covers. Lists are alternatives; different keys must all match.

    Patterns (names, nodes) are shell globs (``serve-*``, ``gpu0[1-4]``). A match of ``nodes``
    alone also covers the bare node: off-hours power never powers it down automatically.
    """

    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    partitions: tuple[str, ...] = ()
    qos: tuple[str, ...] = ()
    name_patterns: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not any((self.users, self.accounts, self.partitions, self.qos, self.name_patterns, self.labels, self.nodes))


@dataclass(frozen=True)
class Protection:
    """A group of targets the agent treats gently: ``never`` touch, ``notify_only``, or needs ``approval``."""

    name: str
    level: Level
    match: Match = field(default_factory=Match)
    reason: str = ""


@dataclass(frozen=True)
class InferenceConfig:
    """How inference services are recognised: declared (partition, name, label) or by behaviour."""

    partitions: tuple[str, ...] = ()
    name_patterns: tuple[str, ...] = ("*serve*", "*inference*", "*vllm*", "*triton*", "*tgi*")
    labels: tuple[str, ...] = ("inference",)
    #: idle→busy transitions within the lookback that mark a bursty service
    min_bursts: Annotated[int, Range(1, 1000)] = 2


@dataclass(frozen=True)
class InteractiveConfig:
    """How interactive sessions are recognised: Slurm's batch flag, partitions, names (globs), labels."""

    #: a job Slurm reports with ``BatchFlag=0`` (salloc, srun outside a batch script) is interactive
    batch_flag: bool = True
    partitions: tuple[str, ...] = ("interactive",)
    name_patterns: tuple[str, ...] = (
        "interactive", "bash", "sh", "zsh", "jupyter*", "*notebook*", "sys/dashboard/*", "spawner-jupyterhub*",
    )
    labels: tuple[str, ...] = ("interactive",)


@dataclass(frozen=True)
class BaselinesConfig:
    """Class baselines: what is normal for each user and kind of job, kept over days in the audit store.

    A class is (user, account, partition, name stem with numbers and hashes stripped, GPU count).
    A job is treated as a service when its class behaves like one (long-lived members that wake
    from long quiet spells, memory resident while quiet), or when it has itself; a service is
    advised, never demoted or killed without a human.
    """

    enabled: bool = True
    #: old behaviour weighs half as much after this long
    half_life: Annotated[float, Dur(), Range(3600, 90 * 86400)] = 3 * 86400.0
    #: a member not seen for this long is forgotten
    forget_after: Annotated[float, Dur(), Range(86400, 366 * 86400)] = 14 * 86400.0
    #: a class's behaviour counts once it has this many members
    min_members: Annotated[int, Range(1, 10_000)] = 3
    #: a wake is activity after at least this long quiet
    quiet_gap: Annotated[float, Dur(), Range(300, 7 * 86400)] = 3600.0
    #: members that lived this long count as long-lived
    long_lived: Annotated[float, Dur(), Range(3600, 30 * 86400)] = 12 * 3600.0
    #: a service's GPUs are busy at most this share of the time
    service_max_busy_share: Share = 0.3
    #: and hold memory while quiet at least this share of the quiet time
    service_min_mem_resident: Share = 0.8
    #: and at least this share of its long-lived members woke from a quiet spell
    service_min_waking_share: Share = 0.5
    #: a job that woke from quiet spells this often itself counts as a service, whatever its class
    member_min_wakes: Annotated[int, Range(1, 1000)] = 2
    #: a young class (its oldest member younger than ``long_lived``, fewer than ``min_members``
    #: long-lived) is judged by its running members seen at least this long, each counting once:
    #: a new deployment's siblings decide in hours, not days. 0: young classes stay unknown
    cold_start: Annotated[float, Dur(), Range(0, 30 * 86400)] = 3 * 3600.0


@dataclass(frozen=True)
class ReplicasConfig:
    """Replica sets: running jobs of one owner with one name stem (replica indices and hashes
    stripped) and the same resident memory per GPU, copies of one service whether or not a
    protection names them. An idle replica of a set whose other members serve is spare capacity:
    it gets advice to scale the set, never a demote, terminate or kill of the one replica.
    """

    #: false: no replica sets (each job judged by its own evidence and its class)
    enabled: bool = True
    #: resident memory per GPU of two members differs by at most this share of the larger
    mem_tolerance: Share = 0.05
    #: a set has at least this many running members
    min_members: Annotated[int, Range(2, 100_000)] = 2
    #: the advice sizes the set for its observed peak of members busy at once plus this share
    headroom: Annotated[float, Range(0, 10)] = 0.25


@dataclass(frozen=True)
class JobLogConfig:
    """The tail of a job's StdOut/StdErr, read through the node wrapper's read-only ``job-log`` verb.

    Patterns are regular expressions, matched case-insensitively line by line against the tail.
    """

    enabled: bool = True
    max_bytes: Annotated[int, Range(512, 65536)] = 16384
    #: jobs whose logs are read per sweep (only jobs a rule would find idle)
    max_jobs_per_sweep: Annotated[int, Range(0, 100_000)] = 50
    finished: tuple[Annotated[str, Regex()], ...] = (
        r"training (is )?(finished|complete|completed|done)", r"finished training", r"evaluation (finished|completed)",
        r"saved? (the )?final (checkpoint|model)", r"all done\b",
    )
    crashed: tuple[Annotated[str, Regex()], ...] = (
        r"^Traceback \(most recent call last\)", r"CUDA out of memory", r"OutOfMemoryError",
        r"NCCL.*(timeout|timed out|watchdog)", r"Segmentation fault", r"core dumped",
    )
    waiting: tuple[Annotated[str, Regex()], ...] = (
        r"press (enter|any key)", r"\[y/n\]", r"waiting for (user )?input", r"password:\s*$",
    )


@dataclass(frozen=True)
class EvidenceConfig:
    """Evidence beyond one job's utilisation, attached to every decision.

    Progress (the job's log written within the window, GPU power above ``power_active_w``, the
    node's CPU or I/O busy on a node the job has to itself, the job's own processes using
    ``job_cpu_cores`` or moving ``io_busy_mib_s``) means a data-loading or checkpointing phase:
    not waste. A finished or crashed log makes a finding stronger; a confidence below
    ``min_confidence`` makes its destructive rungs wait for a human. A job the agent cannot
    classify (its class ``unknown``) whose evidence is ambiguous (memory resident, confidence
    below ``min_confidence``) gets notices only: its owner's "release" answer, or an operator's
    manual request approved by a second operator, is the only way to a destructive action.
    """

    job_log: JobLogConfig = field(default_factory=JobLogConfig)
    #: mean GPU power (W) above which a GPU is doing something (A100/H100 idle near 50-70 W)
    power_active_w: Annotated[float, Range(0, 10_000)] = 150.0
    #: node CPU % above which, on a node the job has to itself, the job is making progress
    cpu_busy: Percent = 50.0
    #: node network + disk MiB/s above which, on a node the job has to itself, the job is reading or writing data
    io_busy_mib_s: Annotated[float, Range(0, 1_000_000)] = 50.0
    #: CPU cores the job's own processes use (the node wrapper's one-second sample on its batch node)
    #: at or above which the job is making progress, shared node or not; their reads and writes count
    #: against ``io_busy_mib_s``
    job_cpu_cores: Annotated[float, Range(0, 10_000)] = 0.5
    min_confidence: Share = 0.5


@dataclass(frozen=True)
class ApprovalConfig:
    """When a human must approve, and how long the agent waits for an answer."""

    #: kill/demote decisions putting more GPU-hours of work at risk than this need approval
    gpu_hours_at_risk: Annotated[float, Range(0, 1e9)] = 24.0
    #: how long a request waits for an answer; later sweeps go on meanwhile (they do not ask again
    #: about the waiting decisions, whose ladder waits for the answer)
    timeout: Annotated[float, Dur(), Range(60, 7 * 86400)] = 3600.0
    #: what a timed-out request means; only "reject" is allowed, so silence never kills
    on_timeout: Literal["reject"] = "reject"
    assigned_users: tuple[str, ...] = ()


@dataclass(frozen=True)
class RollingCaps:
    """Rolling limits on destructive actions, counted in the audit store across runs and workers."""

    #: destructive actions started in the last hour / day
    max_actions_per_hour: Annotated[int, Range(0, 1_000_000)] = 40
    max_actions_per_day: Annotated[int, Range(0, 1_000_000)] = 200
    #: share of the cluster's GPUs that destructive actions started in the last hour / day touched
    max_gpu_share_per_hour: Share = 0.25
    max_gpu_share_per_day: Share = 0.5


@dataclass(frozen=True)
class Caps:
    """Brakes against a bad policy or bad data: exceeding one aborts the acting part of a run.

    ``max_actions_per_run`` and ``max_gpu_share`` hold for one run; ``rolling`` holds for every
    way in together (sweep, manual reclaim, power), and ``entry_points`` may set tighter rolling
    limits for one of them (``manual: {max_actions_per_hour: 5}``). Rolling counts live in the
    audit store, so parallel runs and workers see the same count.
    """

    max_actions_per_run: Annotated[int, Range(0, 100_000)] = 20
    #: share of the cluster's GPUs that destructive actions of one run may touch
    max_gpu_share: Share = 0.10
    rolling: RollingCaps = field(default_factory=RollingCaps)
    entry_points: dict[Literal["sweep", "manual", "power"], RollingCaps] = field(default_factory=dict)
    #: the cluster's GPU count when a snapshot cannot tell (a Slurm-only snapshot with no GPU
    #: metrics and no node GRES); 0: unknown, and then destructive actions are refused
    cluster_gpus: Annotated[int, Range(0, 10_000_000)] = 0


@dataclass(frozen=True)
class ManualConfig:
    """Who may ask the manual reclaim for what.

    Notices may be asked by anyone who can trigger the DAG (recorded with their name). A
    destructive action needs a requester Airflow knows: the owner of every target (when
    ``owners_may_reclaim``) or one of ``operators``. Overriding a protection needs, besides, the
    approval of one of ``override_approvers`` who is not the requester.
    """

    operators: tuple[str, ...] = ()
    owners_may_reclaim: bool = True
    override_approvers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Person:
    """Who a user is on each channel and which channels reach them, e.g. ``bob: {via: [wecom, email], email: bob@example.org, manager: carol}``."""

    manager: str | None = None
    slack: str | None = None
    email: str | None = None
    #: the channels that reach this user, tried in order until one does (``[wecom, email]``);
    #: empty: the user's account's route (``notifications.accounts``), else Slack then e-mail
    via: tuple[ChannelName, ...] = ()
    #: the mobile number DingTalk mentions (``at.atMobiles``) in the robot's group
    dingtalk: str | None = None
    #: the Feishu/Lark open_id (``ou_...``) the card mentions (``<at id=...>``)
    feishu: str | None = None
    #: the Microsoft Teams user (UPN or Entra object id) the card mentions (``<at>...</at>``)
    teams: str | None = None


@dataclass(frozen=True)
class NotificationConfig:
    """When and how people are told."""

    timezone: str = "UTC"
    working_hours: str = "09:00-18:00"
    working_days: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri")
    holidays: tuple[str, ...] = ()
    #: notices to one user per hour, beyond which they are batched into the next message
    max_per_user_per_hour: Annotated[int, Range(1, 1000)] = 4
    #: send e-mail when Slack fails or the user has no Slack handle
    email_fallback: bool = True
    #: the escalation clock only runs in working hours for notify rungs
    only_in_working_hours: bool = False
    slack_channel: str | None = None
    snooze_hint: str = "gpu-cost snooze --target {target} --for 4h --reason '...'"
    #: per team (a Slurm account): the channels that reach its members who name none themselves
    accounts: dict[str, AccountRoute] = field(default_factory=dict)
    #: escalations also open a ticket (a JSON POST); unset: no tickets
    ticket: TicketConfig | None = None


#: the delivery channels a ``via`` may name (each on its connection ``gpu_cost_<name>``, e-mail on ``gpu_cost_smtp``)
ChannelName = Literal["slack", "email", "wecom", "dingtalk", "feishu", "teams"]
#: a notice action (``advise``, ``notify``, ``notify_manager``), checked against the registry when the policy is read
NoticeAction = Annotated[str, OneOf(lambda: registry.names(notice=True))]


@dataclass(frozen=True)
class AccountRoute:
    """The channels that reach a team's members (``notifications.accounts.<account>``)."""

    #: tried in order until one reaches the person (``[feishu, email]``)
    via: tuple[ChannelName, ...] = ()


@dataclass(frozen=True)
class TicketConfig:
    """An escalation ticket: a JSON document (title, body, target, decision id, owner, manager,
    severity) POSTed through the HTTP provider to the connection's endpoint."""

    #: the notices that open a ticket (not ``on:``, which YAML reads as ``true``)
    actions: tuple[NoticeAction, ...] = ("notify_manager",)
    #: the HTTP connection (``http``: host, schema, port, endpoint path in ``extra.endpoint``)
    conn_id: str = "gpu_cost_ticket"


@dataclass(frozen=True)
class SnoozeConfig:
    """Snoozes: an owner's justified request to leave a target alone until a given time."""

    #: the longest snooze anyone may set; longer exemptions belong in ``protections``
    max_duration: Annotated[float, Dur(), Range(60, 366 * 86400)] = 14 * 86400.0
    #: a justification shorter than this is refused
    min_reason_chars: Annotated[int, Range(1, 1000)] = 8


@dataclass(frozen=True)
class AnswersConfig:
    """Answers from the people a notice reaches: keep it (a snooze), release it (the owner's own
    manual reclaim), or this is wrong (the episode ends, the answer is its label, and the target is left alone
    for snooze.max_duration)."""

    enabled: bool = True
    #: the api-server's address as people reach it (``https://airflow.example.org``); links in
    #: notices point at ``<base_url>/gpu-cost/answers/link``. Empty: no links (Slack buttons still work)
    base_url: str = ""
    #: how long one "keep it, I am using it" holds the target; those over ``snooze.max_duration`` are not offered
    keep_durations: tuple[Annotated[float, Dur(), Range(600, 7 * 86400)], ...] = (4 * 3600.0, 8 * 3600.0, 86400.0)
    #: how long a link in a notice stays valid
    link_ttl: Annotated[float, Dur(), Range(600, 30 * 86400)] = 3 * 86400.0
    #: the oldest Slack request accepted (its ``X-Slack-Request-Timestamp``): older is a replay
    slack_max_age: Annotated[float, Dur(), Range(30, 3600)] = 300.0
    #: the target's manager (``people.<owner>.manager``) may answer too, not only its owner
    managers_may_answer: bool = True
    #: the DAG an owner's "release it now" triggers, as the owner (through its guards and caps)
    release_dag: str = "gpu_manual_reclaim"


@dataclass(frozen=True)
class VerifierConfig:
    """A second opinion learnt from outcomes: what happened after earlier decisions (the target busy
    again within ``horizon``, or answered "this is wrong", is a false positive; ended or still idle
    is waste confirmed) trains a model of the chance that a finding is waste (``gpu_cost.learn.verifier``,
    nightly). Below ``min_probability`` a destructive rung needs a human's approval. It only ever
    holds an action back, never causes one; notices are unaffected; the rules stay the floor."""

    enabled: bool = True
    #: labelled decisions (false positives plus waste confirmed) a model needs before it is used
    min_labels: Annotated[int, Range(20, 10_000_000)] = 200
    #: the chance that a finding is waste below which a destructive rung waits for a human
    min_probability: Share = 0.5
    #: what a doubted destructive rung does: ``approval`` asks a human; ``wait`` holds it back
    #: (recorded as what it would do) until a later sweep's score clears it, or the finding ends
    on_doubt: Literal["approval", "wait"] = "approval"
    #: how long after a decision its target is watched: busy again within it is a false positive
    horizon: Annotated[float, Dur(), Range(3600, 14 * 86400)] = 86400.0
    #: the decisions a nightly training reads (and labels)
    history: Annotated[float, Dur(), Range(86400, 366 * 86400)] = 60 * 86400.0
    #: the newest share of the labels (by time) kept out of training to backtest the model on
    test_share: Annotated[float, Range(0.1, 0.5)] = 0.25


@dataclass(frozen=True)
class CostConfig:
    """Money: what a GPU-hour and a kWh cost."""

    gpu_hour_usd: dict[str, Annotated[float, Range(0, 1000)]] = field(
        default_factory=lambda: {"default": 2.0, "a100": 2.0, "h100": 4.0}
    )
    kwh_usd: Annotated[float, Range(0, 100)] = 0.15
    currency: str = "USD"
    #: how long waste with no end in sight (a zombie process, a job with neither forecast nor time
    #: limit) counts in a decision's stakes (its "GPU-h saved"); the savings ledger books only the
    #: waste already seen (docs/savings.md)
    open_ended: Annotated[float, Dur(), Range(600, 7 * 86400)] = 86400.0

    def gpu_hour(self, model: str | None) -> float:
        key = (model or "").lower()
        return float(self.gpu_hour_usd.get(key, self.gpu_hour_usd.get("default", 0.0)))


@dataclass(frozen=True)
class Window:
    """A recurring time window in the policy's time zone; ``end`` before ``start`` wraps midnight."""

    days: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
    start: str = "22:00"
    end: str = "08:00"


@dataclass(frozen=True)
class NodePower:
    """The power figures of one node type (its GPU model, as Slurm's GRES names it: ``a100``, ``h100``);
    a figure left out is the ``offhours`` default."""

    #: the node's draw while idle and up (what powering it down saves per hour)
    idle_power_w: Annotated[float, Range(0, 100_000)] | None = None
    #: the energy one power-down and boot costs (the boot's draw until usable, the shutdown)
    boot_kwh: Annotated[float, Range(0, 100)] | None = None


@dataclass(frozen=True)
class OffhoursConfig:
    """Powering idle nodes down at night and on weekends, through Slurm's power saving."""

    enabled: bool = True
    mode: Mode | None = None
    timezone: str = "UTC"
    windows: tuple[Window, ...] = (
        Window(days=("mon", "tue", "wed", "thu", "fri"), start="22:00", end="08:00"),
        Window(days=("sat", "sun"), start="00:00", end="24:00"),
    )
    util_max: Percent = 10.0
    window: Annotated[float, Dur(), Range(300, 86400)] = 3600.0
    warm_reserve_nodes: Annotated[int, Range(0, 100_000)] = 1
    warm_reserve_share: Share = 0.0
    max_nodes_per_run: Annotated[int, Range(0, 100_000)] = 4
    approval_over_nodes: Annotated[int, Range(0, 100_000)] = 8
    exclude_nodes: tuple[str, ...] = ()
    exclude_partitions: tuple[str, ...] = ()
    high_priority_partitions: tuple[str, ...] = ()
    high_priority_qos: tuple[str, ...] = ("high", "urgent")
    #: wake nodes this long before forecast demand returns (Slurm's ResumeTimeout plus margin)
    wake_lead: Seconds = 1800.0
    idle_power_w: Annotated[float, Range(0, 100_000)] = 400.0
    #: the energy one power-down and boot of a node costs (its boot draws near peak until usable)
    boot_kwh: Annotated[float, Range(0, 100)] = 0.15
    #: power figures per node type (GPU model, lower case), overriding ``idle_power_w`` / ``boot_kwh``
    node_types: dict[str, NodePower] = field(default_factory=dict)
    #: never power down the last this many healthy nodes of a partition (up, not down, drained or failed)
    min_up: Annotated[int, Range(0, 100_000)] = 1
    #: a node that did not come back from power saving (resume failed, GPUs missing after boot) is
    #: not powered down again for this long after it was last seen failing
    failed_hold: Annotated[float, Dur(), Range(0, 366 * 86400)] = 7 * 86400.0
    reason: str = "gpu-cost: off-hours"
    #: a node's GPUs must be seen idle in the metrics; false trusts Slurm's allocation state
    #: alone (a scheduler-only deployment without DCGM)
    require_gpu_metrics: bool = True
    #: wake powered-down nodes when pending jobs need more GPUs than the running nodes have free
    wake_on_pending: bool = True
    #: with a demand forecast, size the nodes kept up by it at any hour, not only inside the
    #: windows: idle nodes go down when the forecast's upper bound over ``lull_min`` fits in the
    #: nodes left up (the forecast replaces ``util_max``), and they stay down through the lull
    forecast_lulls: bool = False
    #: how far ahead a predicted lull must hold before a node goes down for it
    lull_min: Annotated[float, Dur(), Range(3600, 7 * 86400)] = 3 * 3600.0
    #: the warm buffer the forecast keeps: room above the forecast for this quantile of its own errors
    #: at the same hour of the day over the last week (its 80 % band until a week of errors exists);
    #: lower powers more down and makes more jobs wait for boots
    forecast_quantile: Annotated[float, Range(0.5, 1)] = 0.9

    def node_power(self, model: str | None) -> tuple[float, float]:
        """Return (idle watts, kWh a power cycle costs) of a node with GPU model ``model``."""
        t = self.node_types.get((model or "").lower())
        idle = t.idle_power_w if t is not None and t.idle_power_w is not None else self.idle_power_w
        boot = t.boot_kwh if t is not None and t.boot_kwh is not None else self.boot_kwh
        return float(idle), float(boot)


@dataclass(frozen=True)
class ReservationsConfig:
    """Reservations for predicted peaks: when an account's forecast (its 80 % upper bound) needs
    more GPUs than would be free once the other accounts' expected demand is served, the hourly
    power run proposes a Slurm reservation for it ahead of the peak (``reserve``). A reservation
    that then sits unused is shrunk or released by the ``idle_reservation`` rule. Off unless enabled."""

    enabled: bool = False
    mode: Mode | None = None
    #: accounts that may get reservations (empty: every account with a demand forecast)
    accounts: tuple[str, ...] = ()
    #: create the reservation this long before the predicted peak starts
    lead: Annotated[float, Dur(), Range(0, 86400)] = 3600.0
    #: look this far ahead for peaks
    horizon: Annotated[float, Dur(), Range(3600, 7 * 86400)] = 12 * 3600.0
    #: a shortfall under this many GPUs gets no reservation
    min_gpus: Annotated[int, Range(1, 100_000)] = 4
    #: at most this many nodes in one reservation
    max_nodes: Annotated[int, Range(1, 100_000)] = 4
    #: a reservation of more nodes than this needs a human's approval
    approval_over_nodes: Annotated[int, Range(0, 100_000)] = 1
    #: GPUs per node when the nodes do not say (Slurm's GRES)
    gpus_per_node: Annotated[int, Range(1, 64)] = 8
    #: names of the agent's reservations start with this (with its audit row, the proof that one is the agent's own)
    prefix: str = "gpu-cost-"
    #: the partition reservations are made in (empty: Slurm's default)
    partition: str = ""


@dataclass(frozen=True)
class ForecastConfig:
    """Nightly forecasting."""

    enabled: bool = True
    horizon: Annotated[float, Dur(), Range(3600, 30 * 86400)] = 48 * 3600.0
    history: Annotated[float, Dur(), Range(86400, 3 * 366 * 86400)] = 60 * 86400.0
    min_class_jobs: Annotated[int, Range(3, 100_000)] = 30
    series_per_task: Annotated[int, Range(1, 10_000)] = 25
    #: demand series are kept per these job attributes (plus the cluster total)
    dimensions: tuple[Literal["account", "partition", "user"], ...] = ("account", "partition")
    #: on the simulator, at most this much history is generated (keeps the demo quick)
    sim_days: Annotated[float, Range(1, 366)] = 21.0


@dataclass(frozen=True)
class RightsizeConfig:
    """Right-sizing at submission: from the jobs the sweeps saw finish, per user and per job class
    (user and job name stem), the GPUs they needed and the time they ran; the nightly writes the
    advice where ``include/slurm/cli_filter.lua`` reads it, and ``sbatch`` shows it to a user who
    asks for more (``gpu_cost.capacity.rightsize``, docs/rightsizing.md). Advice only, unless ``block``."""

    enabled: bool = True
    #: the history the advice is computed from
    lookback: Annotated[float, Dur(), Range(86400, 366 * 86400)] = 30 * 86400.0
    #: finished jobs a user or a class needs before it gets advice (fewer: nothing is said)
    min_jobs: Annotated[int, Range(1, 100_000)] = 5
    #: the quantile of a job's samples it needed GPUs for, and of the jobs' needs and run times
    quantile: Annotated[float, Range(0.5, 1)] = 0.9
    #: fewer GPUs are advised only when that saves at least this share of the GPUs asked
    gpu_cut_min: Annotated[float, Range(0.1, 0.9)] = 0.5
    #: headroom added to the run time quantile before it is advised as ``--time``
    time_margin: Annotated[float, Range(0, 5)] = 0.25
    #: a shorter ``--time`` is advised only when it is at most (1 - this) of the limit asked
    time_cut_min: Annotated[float, Range(0.1, 0.9)] = 0.5
    #: the advised ``--time`` is rounded up to a multiple of this
    time_round: Annotated[float, Dur(), Range(60, 86400)] = 900.0
    #: where the advice for the Slurm cli_filter is written (a relative path is under the agent's
    #: state folder, ``GPU_COST_HOME``); empty: rows in the audit store only, no file
    advice_file: str = "gpu-cost-advice.tsv"
    #: true: ``sbatch`` refuses a request of more than ``block_factor`` times the advised GPUs
    block: bool = False
    block_factor: Annotated[float, Range(1.5, 100)] = 4.0


@dataclass(frozen=True)
class ReportConfig:
    """The weekly report."""

    out_dir: str = "reports"
    timezone: str = "UTC"
    slack: bool = True


@dataclass(frozen=True)
class Policy:
    """The whole policy document. ``mode`` is global; a rule's ``mode`` may only be milder."""

    version: Literal[1] = 1
    mode: Mode = "dry-run"
    sweep: SweepConfig = field(default_factory=SweepConfig)
    rules: Rules = field(default_factory=Rules)
    protections: tuple[Protection, ...] = (
        Protection(name="no-interrupt label", level="never", match=Match(labels=("no-interrupt",))),
    )
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    interactive: InteractiveConfig = field(default_factory=InteractiveConfig)
    baselines: BaselinesConfig = field(default_factory=BaselinesConfig)
    replicas: ReplicasConfig = field(default_factory=ReplicasConfig)
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)
    approval: ApprovalConfig = field(default_factory=ApprovalConfig)
    caps: Caps = field(default_factory=Caps)
    manual: ManualConfig = field(default_factory=ManualConfig)
    #: the actions' settings, each a top-level section (``demote:``) declared by its executor module;
    #: ``actions`` itself is no key of the file
    actions: Actions = field(default_factory=Actions, metadata={SPREAD: True})
    people: dict[str, Person] = field(default_factory=dict)
    notifications: NotificationConfig = field(default_factory=NotificationConfig)
    snooze: SnoozeConfig = field(default_factory=SnoozeConfig)
    answers: AnswersConfig = field(default_factory=AnswersConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    offhours: OffhoursConfig = field(default_factory=OffhoursConfig)
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    reservations: ReservationsConfig = field(default_factory=ReservationsConfig)
    rightsize: RightsizeConfig = field(default_factory=RightsizeConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    #: where the policy came from (set by the loader, not a YAML key)
    source: str = field(default="<defaults>", init=False, compare=False)

    if not TYPE_CHECKING:  # at run time only: the type checker still refuses a misspelt attribute

        def __getattr__(self, name: str) -> Any:
            """``policy.demote`` is ``policy.actions.demote``: an action's section, as the file spells it."""
            actions = self.__dict__.get("actions") if not name.startswith("_") else None
            if actions is None or name not in actions.configs():
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            return actions[name]

    def rule_mode(self, rule: str) -> str:
        """Return the effective mode of a rule: the milder of the global and the rule's own."""
        try:
            cfg = self.rule(rule)
        except AttributeError:
            return self.mode
        own = getattr(cfg, "mode", None)
        return milder(self.mode, own) if own else self.mode

    def rule(self, name: str) -> Any:
        """Return rule ``name``'s section: the policy's, or its registered dataclass's defaults."""
        try:
            return self.rules[name]
        except KeyError:
            raise AttributeError(f"no rule {name!r}") from None

    def manager_of(self, user: str | None) -> str | None:
        """Return the manager of ``user`` from ``people``, or None."""
        person = self.people.get(user or "")
        return person.manager if person else None


_MODE_ORDER = {m: i for i, m in enumerate(MODES)}  # the one list, mildest first


def milder(a: str, b: str) -> str:
    """Return the milder of two modes (dry-run < notify < enforce)."""
    return a if _MODE_ORDER[a] <= _MODE_ORDER[b] else b
