"""The coordinator's policy: a versioned fault catalogue plus pure functions that turn health
events into decisions (actions as values). No I/O besides loading the catalogue and policy
files; time comes in as ``now`` (Unix seconds on the timeline of event receipt).
"""

from recovery.policy._files import PolicyFileError
from recovery.policy.breaker import (
    BreakerStatus,
    PartitionLoad,
    breaker_reset,
    breaker_status,
    split_held,
)
from recovery.policy.catalogue import (
    Catalogue,
    FaultSpec,
    Severity,
    default_catalogue_path,
    load_catalogue,
)
from recovery.policy.config import (
    BreakerConfig,
    FlappingConfig,
    PolicyConfig,
    RepairCheck,
    SpareTopology,
    load_policy_config,
)
from recovery.policy.decide import DRIVER_VERDICTS, decide
from recovery.policy.placement import choose_spare, topology_group
from recovery.policy.repair import RepairVerdict, advance_repaired, on_repaired
from recovery.policy.state import (
    ClusterView,
    Failure,
    Incident,
    NodeState,
    PolicyState,
    advance,
    incident_id,
    rebuild,
)
from recovery.policy.whatif import ReplayDifference, differences, replay

__all__ = [
    "DRIVER_VERDICTS",
    "BreakerConfig",
    "BreakerStatus",
    "Catalogue",
    "ClusterView",
    "Failure",
    "FaultSpec",
    "FlappingConfig",
    "Incident",
    "NodeState",
    "PartitionLoad",
    "PolicyConfig",
    "PolicyFileError",
    "PolicyState",
    "RepairCheck",
    "RepairVerdict",
    "ReplayDifference",
    "Severity",
    "SpareTopology",
    "advance",
    "advance_repaired",
    "breaker_reset",
    "breaker_status",
    "choose_spare",
    "decide",
    "default_catalogue_path",
    "differences",
    "incident_id",
    "load_catalogue",
    "load_policy_config",
    "on_repaired",
    "rebuild",
    "replay",
    "split_held",
    "topology_group",
]
