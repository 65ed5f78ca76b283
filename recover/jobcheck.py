"""How ``recover supervise-job`` checks the spares of its job (``--check-spares``): the
coordinator's cheap checks of the node (agent, incidents, accelerators: ``GET
/v1/nodes/{node}/check``, read-only), then a burn-in step of the job on it
(``slurm.jobstep.JobSteps.burn_in``). The site's ``validation`` policy, as the coordinator
answers it, says whether spares must be checked, how fresh a check must be, how many
accelerators a node shows and the burn-in's budget."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from recovery.errors import RecoverError
from recovery.pool.validate import CheckResult, NodeCheck, ValidationSettings
from service.httpapi.client import Client
from slurm.jobstep import JobSteps


@dataclass
class AllocationSpareCheck:
    """A :class:`recovery.inalloc.vetting.SpareCheck` for a spare of this job."""

    steps: JobSteps
    client: Client | None
    settings: ValidationSettings
    peer: str | None = None
    """A healthy node of the job (the batch host) for the burn-in's collective."""

    def check(self, node: str, *, burn_in: bool) -> NodeCheck:
        results: list[CheckResult] = []
        if self.client is not None:
            started = time.monotonic()
            try:
                doc = self.client.get(f"/v1/nodes/{node}/check")
                results += [CheckResult.from_json(r) for r in doc.get("results", [])]
            except RecoverError as e:
                took = round(time.monotonic() - started, 3)
                results.append(CheckResult("coordinator", None, f"not asked: {e}", took))
        if any(r.ok is False for r in results):
            results.append(CheckResult("burn-in", None, "skipped: a cheaper check failed"))
        elif not burn_in:
            results.append(CheckResult("burn-in", None, "not run: one passed recently"))
        elif self.settings.burn_in:
            out = self.steps.burn_in(
                node, self.settings.burn_in_budget_s,
                expect_devices=self.settings.accelerators or 0,
                peer=self.peer if self.peer != node else None,
            )  # fmt: skip
            results.append(CheckResult("burn-in", out.ok, out.detail, round(out.took_s, 3)))
        else:
            results.append(CheckResult("burn-in", None, "skipped: the policy runs none"))
        return NodeCheck(node, time.time(), tuple(results), standing="job spare")


def site_policy(client: Client | None, node: str) -> tuple[ValidationSettings | None, str]:
    """The coordinator's ``validation`` policy, asked with ``node``'s check; None and why
    when it cannot be had."""
    if client is None:
        return None, "no coordinator to ask"
    try:
        doc: Any = client.get(f"/v1/nodes/{node}/check")
    except RecoverError as e:
        return None, str(e)
    policy = doc.get("policy") if isinstance(doc, dict) else None
    if not isinstance(policy, dict):
        return None, "the coordinator does not say its validation policy (an older version)"
    known = set(ValidationSettings.__dataclass_fields__)
    try:
        return ValidationSettings(**{k: v for k, v in policy.items() if k in known}), ""
    except (TypeError, ValueError) as e:
        return None, f"the coordinator's validation policy is not usable: {e}"
