"""Test hosts as network namespaces: ``shinglefs.testbed.netns``, re-exported
under the name the multi-host tests import."""

from shinglefs.testbed.netns import (
    PREFIX,
    Cluster,
    Host,
    HostProcess,
    NetnsError,
    choose_subnet,
    remove_leftovers,
    unavailable_reason,
)

__all__ = ["PREFIX", "Cluster", "Host", "HostProcess", "NetnsError", "choose_subnet",
           "remove_leftovers", "unavailable_reason"]
