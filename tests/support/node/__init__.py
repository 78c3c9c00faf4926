"""A Kubernetes node on this machine for the tests (containerd + kubelet), and the record
of what it changes on the host: see :mod:`tests.support.node.node`."""
