"""The real control plane on this machine: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok, KEDA and prometheus-adapter, built from their Go modules
(``cluster/build``) and run in a network namespace of their own (``./dev cluster``).

Only the GPUs, the inference engines and the kubelet are simulated. Every process listens
inside the namespace (``netns``), whose pod addresses the host reaches through one veth
pair: nothing binds an address outside this machine's own test namespace.
"""
