"""The local Slurm cluster's shape and its configuration files: pure, no daemons (those are launcher.localcluster).

Its TCP ports are a slot of PORT_STEP ports in 10000-19999 (slurmctld on 10000 + 25 * slot, node K's slurmd on that
+ K, slurmdbd on that + 20; a cluster has at most 19 nodes): below Linux's ephemeral range (32768-60999 by default),
where any outgoing connection on the machine may hold a port as its own end, and apart from the jobs' rendezvous
ports (launcher.protocol's RDZV_PORT_WINDOW, 20000-31999), which the local cluster's jobs open on this same
127.0.0.1. The slot derives from a hash of the cluster's directory (`ClusterSpec.slot`), so clusters in different
directories do not collide; `launcher.localcluster.ports` moves a cluster to the next free slot where a port of its
own is taken when it starts.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import zlib
from pathlib import Path

from launcher import protocol
from launcher.localcluster import accounting, containers

PORT_BASE, PORT_SLOTS, PORT_STEP = 10000, 400, 25
MAX_NODES, DBD_OFFSET = 19, 20  # node K's slurmd on the slot's port + K; slurmdbd on + DBD_OFFSET
# The clusters' first job ids: a window of JOB_ID_WINDOW of their own in the rendezvous window (see first_job_id)
JOB_ID_WINDOW = 1000
JOB_ID_WINDOWS = protocol.RDZV_PORT_SPAN // JOB_ID_WINDOW
MUNGE_ROOT = Path("/tmp")


def default_dir() -> Path:
    """`<project root>/.slurm`, the project root being the directory that holds the `launcher` package; or
    $LAUNCHER_LOCALCLUSTER_DIR where set (scripts/slurm_root.sh sets `.slurm-24.11` or `.slurm-26.05`, a cluster of
    that Slurm release)."""
    return Path(os.environ.get("LAUNCHER_LOCALCLUSTER_DIR") or Path(__file__).resolve().parents[2] / ".slurm")


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """Where the cluster lives and its shape: `nodes` virtual nodes with `gpus_per_node` fake GPUs each, and the
    site settings the tests vary.

    Preemption is set up as many sites do: two partitions over the same nodes, `debug` (the default, priority tier
    1, jobs preempted by requeue after `preempt_grace_s` seconds of SIGTERM) and `urgent` (tier 2, never
    preempted); a job in `urgent` that needs the GPUs a `debug` job holds preempts it. `send_user_signal` makes
    Slurm send a job's own `--signal` instead of SIGTERM at preemption (`SlurmctldParameters=preempt_send_user_signal`
    on Slurm 22.05; `PreemptParameters=send_user_signal` on newer releases).
    """

    dir: Path = dataclasses.field(default_factory=default_dir)
    nodes: int = 2
    gpus_per_node: int = 2
    preempt_grace_s: int = 60
    send_user_signal: bool = False
    slurmd_timeout_s: int = 60  # how long slurmctld waits for a silent slurmd before the node is DOWN (NODE_FAIL)
    # the credentials' lifetime (munge's cred_expire): a requeued job cannot start for this long and 1 s more; 10 s
    # keeps the tests short, Slurm's default is 120 (bench/bench_goodput.py measures a requeue's wait with it)
    cred_expire_s: int = 10
    read_only: tuple[tuple[str, str], ...] = ()  # (node, path): that node, and its jobs, see the path read-only
    containers: bool = False  # pyxis + enroot on every node (srun --container-image): launcher.localcluster.containers
    accounting: bool = False  # slurmdbd on a MariaDB of the cluster's own (launcher/localcluster/accounting.py)
    # which slot of PORT_SLOTS its ports take (None: the directory's, from a hash of its path); `up` moves a cluster
    # whose ports are taken to a free slot, and keeps the slot its slurm.conf names (launcher.localcluster.ports)
    port_slot: int | None = None
    expedited_requeue: bool = False  # SlurmctldParameters=enable_expedited_requeue (Slurm 25.11+: --requeue=expedite)
    max_job_count: int = 10000  # MaxJobCount (Slurm's default): the jobs the controller holds, finished ones included
    block_nodes: int = 0  # topology/block in blocks of this many nodes (Slurm 23.11+; 0: no topology plugin)
    min_job_age_s: int = 600  # MinJobAge: how long a finished job stays in scontrol/squeue (and counts in the above)
    # UnkillableStepTimeout: how long a step's tasks may take to end once signalled to (a cancel, a time limit, the
    # job's end) before slurmstepd drains the node "Kill task failed"; Slurm's default is 60 (see slurm_conf)
    unkillable_step_timeout_s: int = 180

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir).resolve())
        if not 1 <= self.nodes <= MAX_NODES or self.gpus_per_node < 0:
            raise ValueError(f"need 1..{MAX_NODES} nodes and >= 0 GPUs per node, got {self}")
        if self.port_slot is not None and not 0 <= self.port_slot < PORT_SLOTS:
            raise ValueError(f"port_slot must be within 0..{PORT_SLOTS - 1}, got {self.port_slot}")

    @property
    def conf(self) -> Path:
        return self.dir / "etc" / "slurm.conf"

    @property
    def slot(self) -> int:
        """The port slot: `port_slot`, or the directory's own."""
        return zlib.crc32(str(self.dir).encode()) % PORT_SLOTS if self.port_slot is None else self.port_slot

    @property
    def ctld_port(self) -> int:
        return PORT_BASE + PORT_STEP * self.slot

    def slurmd_port(self, k: int) -> int:
        """The port of node K's slurmd (node1 is K=1)."""
        return self.ctld_port + k

    @property
    def dbd_port(self) -> int:
        return self.ctld_port + DBD_OFFSET

    @property
    def ports(self) -> list[int]:
        """Every TCP port the cluster's daemons listen on (MariaDB listens on none: a Unix socket only)."""
        nodes = [self.slurmd_port(k) for k in range(1, self.nodes + 1)]
        return [self.ctld_port, *nodes, *([self.dbd_port] if self.accounting else [])]

    @property
    def job_id_window(self) -> int:
        """Which of the JOB_ID_WINDOWS windows of job ids the cluster's take: its port slot's (`slot`)."""
        return self.slot % JOB_ID_WINDOWS

    @property
    def first_job_id(self) -> int:
        """Job ids start in a window of 1,000 of this cluster's own: the job's rendezvous port derives from its id
        (launcher.protocol: 20000 + id % 12000), and clusters on one machine share 127.0.0.1, so two clusters' job 1
        must not meet: two jobs with one id would meet on one port and in the rendezvous named by that id, and break
        it. `launcher.localcluster.ports` starts a cluster on a slot whose window no running cluster holds."""
        return 1 + JOB_ID_WINDOW * self.job_id_window

    @property
    def node_names(self) -> list[str]:
        return [f"node{k}" for k in range(1, self.nodes + 1)]

    @property
    def munge_dir(self) -> Path:
        """munged runs as user munge, which must reach its socket and key: a world-traversable place under /tmp,
        so the cluster directory may sit below private directories (a CI checkout, pytest's temp)."""
        return MUNGE_ROOT / f"launcher-munge-{zlib.crc32(str(self.dir).encode()):08x}"

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}


def _ctld_parameters(spec: ClusterSpec) -> str:
    """slurm.conf's SlurmctldParameters line (commented out where none is asked)."""
    asked = [p for p, on in (("preempt_send_user_signal", spec.send_user_signal),
                             ("enable_expedited_requeue", spec.expedited_requeue)) if on]  # fmt: skip
    return f"SlurmctldParameters={','.join(asked)}" if asked else "#SlurmctldParameters=preempt_send_user_signal"


def slurm_conf(spec: ClusterSpec) -> str:
    d, host, gres = spec.dir, socket.gethostname(), f" Gres=gpu:{spec.gpus_per_node}" if spec.gpus_per_node else ""
    memory_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 // 2
    nodes = "\n".join(
        f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={spec.slurmd_port(k)} "
        f"CPUs={os.cpu_count()} RealMemory={memory_mib}{gres} State=UNKNOWN"
        for k, name in enumerate(spec.node_names, start=1)
    )
    common = "Nodes=ALL MaxTime=INFINITE State=UP OverSubscribe=FORCE"
    low = f"Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime={spec.preempt_grace_s}"
    partitions = f"PartitionName=debug {common} {low}\nPartitionName=urgent {common} PriorityTier=2 PreemptMode=OFF"
    return f"""# Generated by launcher/localcluster.py: a {spec.nodes}-node cluster on this one machine.
ClusterName=local
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={spec.ctld_port}
SlurmUser=root
SlurmdUser=root
# A private munged; AuthInfo's socket is used by both auth/munge and cred/munge.
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={spec.munge_dir}/munge.socket.2,cred_expire={spec.cred_expire_s}
# Plain processes, no cgroups; finished jobs stay in scontrol/squeue MinJobAge seconds (and in sacct, with accounting).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
{accounting.slurm_conf_lines(spec) if spec.accounting else "AccountingStorageType=accounting_storage/none"}
JobCompType=jobcomp/filetxt
JobCompLoc={d}/log/jobcomp.log
MinJobAge={spec.min_job_age_s}
MaxJobCount={spec.max_job_count}
{"TopologyPlugin=topology/block" if spec.block_nodes else ""}
FirstJobId={spec.first_job_id}
# Schedule at once; requeue allowed; nodes return to service when their slurmd registers again.
SchedulerParameters=batch_sched_delay=0,sched_interval=2,bf_interval=1
JobRequeue=1
KillWait=5
# slurmstepd drains its node "Kill task failed" where its tasks are not all reaped this long after a terminate request
# (counted from the request, SIGKILL sent at once: proctrack/linuxproc has no cgroup to freeze or empty). Every node
# here shares one machine's disk and cores with the other nodes' training: a task with a thread in an uninterruptible
# write (an fsync queued behind checkpoints) ends only when the write does, and slurmstepd waits its turn for a CPU.
UnkillableStepTimeout={spec.unkillable_step_timeout_s}
InactiveLimit=0
MessageTimeout=10
SlurmdTimeout={spec.slurmd_timeout_s}
ReturnToService=2
# Preemption by partition priority: a job in `urgent` takes the nodes of `debug` jobs, which are requeued after
# their grace time (SIGTERM first{", or their own --signal" if spec.send_user_signal else ""}, SIGKILL at its end).
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
# (Slurm 22.05 spells newer releases' PreemptParameters=send_user_signal as a SlurmctldParameters option.)
{_ctld_parameters(spec)}
# State, pid and log files, all under {d}; %n is the virtual node's name.
StateSaveLocation={d}/state/ctld
SlurmdSpoolDir={d}/state/%n
SlurmctldPidFile={d}/run/slurmctld.pid
SlurmdPidFile={d}/run/slurmd.%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.%n.log
# Fake GPUs: schedulable gres backed by plain files (see gres.conf).
GresTypes=gpu
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Virtual nodes: same host, one slurmd port each; CPUs are shared (OverSubscribe=FORCE).
{nodes}
{partitions}
""" + (f"PlugStackConfig={d}/etc/plugstack.conf\n" if spec.containers else "")


def gres_conf(spec: ClusterSpec) -> str:
    files = f"{spec.dir}/dev/gpu[0-{spec.gpus_per_node - 1}]"
    gpus = f"NodeName=node[1-{spec.nodes}] Name=gpu File={files}\n" if spec.gpus_per_node else ""
    return f"# Generated by launcher/localcluster.py: plain files as GPU devices.\nAutoDetect=off\n{gpus}"


def config_files(spec: ClusterSpec) -> dict[Path, str]:
    """The cluster's configuration files and their text."""
    files = {spec.conf: slurm_conf(spec), spec.conf.with_name("gres.conf"): gres_conf(spec)}
    if spec.containers:
        files[spec.conf.with_name("plugstack.conf")] = containers.plugstack_conf(spec.dir)
    if spec.block_nodes:
        files[spec.conf.with_name("topology.conf")] = topology_conf(spec)
    return files


def topology_conf(spec: ClusterSpec) -> str:
    """topology/block: the nodes in blocks of `block_nodes`, in order (a job's nodes come from as few as can hold
    them, each block whole or in BlockSizes' pieces)."""
    size = spec.block_nodes
    blocks = [f"BlockName=block{b + 1} Nodes=node[{b * size + 1}-{min(spec.nodes, (b + 1) * size)}]"
              for b in range((spec.nodes + size - 1) // size)]  # fmt: skip
    return "# Generated by launcher/localcluster.py\n" + "\n".join(blocks) + f"\nBlockSizes={size}\n"
