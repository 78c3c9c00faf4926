"""The host snapshot the pod test compares before and after its node: each kind of change
a kubelet or containerd leaves behind is reported, Docker's own parts are not.

Pure comparisons of readings (and one real reading of this machine compared with itself),
so they run anywhere; the pod test (test_pods_run.py) compares real readings around a
real node.
"""

from __future__ import annotations

import copy

import pytest

from tests.support.node import host_state
from tests.support.node.host_state import HostState, differences


def reading() -> HostState:
    return HostState(
        sysctls={name: "0" for name in host_state.SYSCTLS},
        cgroups={"memory:/", "cpu:/"},
        mounts=["/ (ext4)", "/sys/fs/cgroup (tmpfs)"],
        links={"lo master=-", "eth0 master=-"},
        paths={str(p): None for p in host_state.WATCHED_PATHS},
        iptables={"iptables-save": ["*filter", ":INPUT ACCEPT", "COMMIT"]},
    )


def test_an_unchanged_host_has_no_difference() -> None:
    assert differences(reading(), reading()) == []


@pytest.mark.parametrize(
    ("change", "reported"),
    [
        (lambda s: s.sysctls.update({"kernel.panic": "10"}), "sysctl kernel.panic: 0 -> 10"),
        (lambda s: s.cgroups.add("memory:/gym-node/kubepods"), "cgroup added: memory:/gym-node"),
        (lambda s: s.mounts.append("/run/netns/cni-1 (nsfs)"), "mount /run/netns/cni-1 (nsfs)"),
        (lambda s: s.links.add("gymt1a2b master=-"), "link added: gymt1a2b master=-"),
        (lambda s: s.paths.update({"/var/lib/cni": ["results"]}), "/var/lib/cni: absent -> 1"),
        (
            lambda s: s.iptables["iptables-save"].insert(2, ":KUBE-FIREWALL - "),
            "iptables-save added: :KUBE-FIREWALL",
        ),
    ],
    ids=["sysctl", "cgroup", "mount", "link", "path", "iptables"],
)
def test_each_kind_of_leftover_is_reported(change: object, reported: str) -> None:
    after = copy.deepcopy(reading())
    change(after)  # type: ignore[operator]
    found = differences(reading(), after)
    assert len(found) == 1 and found[0].startswith(reported), found


def test_a_reading_of_this_machine_equals_itself() -> None:
    """Nothing in a reading is noise (counters, times): two readings in a row agree."""
    first = host_state.snapshot()
    assert differences(first, host_state.snapshot()) == []
    assert set(first.sysctls) == set(host_state.SYSCTLS)
