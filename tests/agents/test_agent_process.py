"""The agent as a real process against the real API: kernel-log lines reach the journal once
each across a SIGKILL and a coordinator outage; a flood is folded; SIGTERM flushes what the
deduplicator holds; heartbeats arrive; a missing NVML is one line and the rest runs on."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from agents.follow import format_fault_line
from agents.inject import simulated_bus
from recovery.policy import load_catalogue
from tests.agents.helpers import wait_for
from tests.agents.live import AgentProcess, LiveCoordinator

Start = Callable[..., AgentProcess]
XIDS = [int(c[3:]) for c in load_catalogue().known() if c.startswith("xid")]


def fault_lines(pairs: list[tuple[int, int]], t0: float = 100.0) -> list[str]:
    """One dmesg-style line per (xid, gpu), each with its own timestamp."""
    return [
        f"[{t0 + i / 1000:12.6f}] " + format_fault_line(f"xid{x}", simulated_bus(g))
        for i, (x, g) in enumerate(pairs)
    ]


@pytest.mark.slow
def test_sigkill_mid_delivery_loses_nothing_and_duplicates_nothing(
    live: LiveCoordinator, agents: Start
) -> None:
    gpus = 50
    pairs = [(x, g) for g in range(gpus) for x in XIDS]  # distinct keys: nothing is folded
    first = agents("n1", "--simulated-gpus", str(gpus))
    first.write_lines(fault_lines(pairs))
    wait_for(lambda: len(live.stored_ids()) > 0, "the first events to arrive", timeout_s=30)
    first.kill()
    at_kill = len(live.stored_ids())
    assert at_kill < len(pairs), "the kill came after delivery ended: nothing was tested"
    again = agents("n1", "--simulated-gpus", str(gpus))
    wait_for(
        lambda: len(live.stored_ids()) >= len(pairs),
        f"all {len(pairs)} events (had {at_kill} at the kill)",
        timeout_s=180,  # 1,500 fsynced events; a busy shared machine takes minutes
    )
    got = Counter((e.fault, e.accelerator) for e in live.stored())
    assert got == Counter((f"xid{x}", g) for x, g in pairs)  # each line exactly once
    assert again.alive()


def test_coordinator_outage_then_restart_delivers_every_event_once(
    live: LiveCoordinator, agents: Start
) -> None:
    agent = agents("n1", "--simulated-gpus", "10")
    pairs = [(x, g) for g in range(10) for x in XIDS[:10]]
    agent.write_lines(fault_lines(pairs[:50]))
    wait_for(lambda: len(live.stored_ids()) == 50, "the events sent before the outage")
    live.stop()
    agent.write_lines(fault_lines(pairs[50:], t0=200.0))
    wait_for(lambda: "retrying" in agent.log(), "the agent to notice the outage")
    live.start()
    wait_for(lambda: len(live.stored_ids()) == 100, "the events spooled during the outage")
    got = Counter((e.fault, e.accelerator) for e in live.stored())
    assert got == Counter((f"xid{x}", g) for x, g in pairs)


def test_a_10000_line_flood_becomes_a_bounded_number_of_events(
    tmp_path: Path, live: LiveCoordinator, agents: Start
) -> None:
    flood = [
        f"[{100 + i / 100:12.6f}] NVRM: Xid (PCI:0000:3b:00): 95, pid=7, name=python, "
        "Uncontained: FBHUB. RST: Yes, D-RST: No"
        for i in range(10_000)
    ]
    log = tmp_path / "n1.kmsg"
    log.write_text("\n".join(flood) + "\n")  # there before the agent starts
    agent = agents("n1", "--dedup-window", "600")
    wait_for(lambda: len(live.stored_ids()) == 1, "the first occurrence", timeout_s=30)
    mark = agent.spool / ".kmsg-mark.json"
    size = log.stat().st_size
    wait_for(
        lambda: mark.exists() and json.loads(mark.read_text())["offset"] == size,
        "every line to be read and folded",
        timeout_s=60,
    )
    assert agent.terminate() == 0  # the open window's summary leaves on the way out
    events = live.stored()
    assert len(events) == 2
    assert [e.count for e in events] == [1, 9_999]
    assert events[1].id == events[0].id + ".r"


def test_sigterm_flushes_open_windows_into_the_journal_and_exits_cleanly(
    tmp_path: Path, live: LiveCoordinator, agents: Start
) -> None:
    agent = agents("n1", "--dedup-window", "600")
    agent.write_lines(fault_lines([(79, 0)] * 5))
    wait_for(lambda: len(live.stored_ids()) == 1, "the first occurrence")
    wait_for(lambda: "sources kmsg" in agent.log(), "the agent's start line")
    assert agent.terminate() == 0
    events = live.stored()
    assert [e.count for e in events] == [1, 4]  # the summary left on the way out
    assert "stopped; 0 event(s) left in the spool" in agent.log()


def test_heartbeats_reach_the_tracker_with_the_agent_version(
    live: LiveCoordinator, agents: Start
) -> None:
    agent = agents("n2")
    channel = live.channel
    assert channel is not None
    wait_for(lambda: channel.heartbeats.last_seen("n2") is not None, "a heartbeat from n2")
    first = channel.heartbeats.last_seen("n2")
    wait_for(lambda: channel.heartbeats.last_seen("n2") != first, "a second heartbeat")
    assert channel.heartbeats.version("n2") == "0.1.0"
    assert agent.alive()
    assert live.stored_ids() == []  # heartbeats are not journaled


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this machine has an NVIDIA driver")
def test_without_nvml_one_line_says_so_and_the_kernel_log_still_works(
    live: LiveCoordinator, agents: Start
) -> None:
    agent = agents("n1", sources="nvml,kmsg")
    agent.write_lines(fault_lines([(79, 0)]))
    wait_for(lambda: len(live.stored_ids()) == 1, "the kernel-log event")
    wait_for(lambda: "NVML" in agent.log(), "the agent to say NVML is unavailable")
    nvml_lines = [line for line in agent.log().splitlines() if "NVML" in line]
    assert len(nvml_lines) == 1, agent.log()
    assert "unavailable" in nvml_lines[0]


@pytest.mark.slow
def test_a_fault_logged_before_the_agent_is_reported_once_and_restarts_repeat_nothing(
    tmp_path: Path, live: LiveCoordinator, agents: Start
) -> None:
    """Boot replay: the agent starts after the fault and reads this boot's log from its start;
    a SIGKILL and a SIGTERM later, no line was ever sent twice (boot id + read mark)."""
    (tmp_path / "n1.kmsg").write_text(fault_lines([(79, 0)], t0=50.0)[0] + "\n")
    first = agents("n1", "--simulated-gpus", "4", kmsg_from="auto")
    wait_for(lambda: len(live.stored_ids()) == 1, "the fault logged before the agent started")
    wait_for(lambda: (first.spool / ".kmsg-mark.json").exists(), "the read mark")
    wait_for(first.spool_empty, "the acknowledgement")
    first.kill()
    first.write_lines(fault_lines([(48, 1)], t0=100.0))  # while no agent runs
    second = agents("n1", "--simulated-gpus", "4", kmsg_from="auto")
    wait_for(lambda: len(live.stored_ids()) == 2, "the line logged while no agent ran")
    wait_for(second.spool_empty, "the acknowledgement")
    assert second.terminate() == 0
    third = agents("n1", "--simulated-gpus", "4", kmsg_from="auto")
    # A line written after the restart arrives after anything the restart would re-send.
    third.write_lines(fault_lines([(95, 2)], t0=150.0))
    wait_for(lambda: len(live.stored_ids()) == 3, "the line written after the last restart")
    assert [(e.fault, e.accelerator) for e in live.stored()] == [
        ("xid79", 0), ("xid48", 1), ("xid95", 2)
    ]  # fmt: skip
    assert live.duplicates() == 0, "a restart sent a line again"


def test_the_agents_metrics_tell_what_it_detected_spooled_and_delivered(
    live: LiveCoordinator, agents: Start
) -> None:
    """``--metrics-listen``: detected by source, the spool's depth, and how long ago events
    were delivered and a heartbeat answered, as Prometheus reads them; a coordinator outage
    shows as a spool that grows and a delivery age that keeps growing."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    from recovery.proc import free_ports
    from tests.helpers import promtool_passes

    (port,) = free_ports(1)
    agent = agents("n1", "--simulated-gpus", "4", "--metrics-listen", f"127.0.0.1:{port}")

    def scrape() -> dict[tuple[str, str], float]:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        return {(s.name, s.labels.get("source", "")): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}  # fmt: skip

    agent.write_lines(fault_lines([(79, 0), (48, 1)]))
    wait_for(lambda: len(live.stored_ids()) == 2, "both events delivered")
    wait_for(lambda: scrape().get(("recover_agent_heartbeat_age_seconds", ""), 99) < 5,
             "a heartbeat answered")  # fmt: skip
    got = scrape()
    assert got[("recover_agent_events_detected_total", "kmsg")] == 2
    assert got[("recover_agent_spool_events", "")] == 0
    assert 0 <= got[("recover_agent_last_post_age_seconds", "")] < 30
    live.stop()
    agent.write_lines(fault_lines([(79, 2)], t0=200.0))
    wait_for(lambda: scrape()[("recover_agent_spool_events", "")] == 1, "the event spooled")
    before = scrape()[("recover_agent_last_post_age_seconds", "")]
    wait_for(lambda: scrape()[("recover_agent_last_post_age_seconds", "")] > before + 1,
             "the delivery age to grow while the coordinator is away")  # fmt: skip
    assert scrape()[("recover_agent_events_detected_total", "kmsg")] == 3
    promtool_passes(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)


def test_a_metrics_port_that_is_taken_is_a_clear_error(
    live: LiveCoordinator, agents: Start
) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        agent = agents("n1", "--metrics-listen", f"127.0.0.1:{port}")
        wait_for(lambda: not agent.alive(), "the agent to refuse the address")
    assert f"--metrics-listen 127.0.0.1:{port}: cannot serve there" in agent.log()
    assert "Traceback" not in agent.log()
