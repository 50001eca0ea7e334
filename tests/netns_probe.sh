# Sourced by the network-namespace tests: skip() exits 77 with a sentence;
# netns_probe WHAT exits 77 unless this process can create a namespace and
# a veth pair in it (WHAT names what needs root, for the sentence).
skip() {
    echo "SKIP: $*"
    exit 77
}
netns_probe() {
    [[ $(id -u) == 0 ]] || skip "${1:-creating network namespaces} needs root"
    command -v ip >/dev/null 2>&1 || skip "'ip' (iproute2) is not installed"
    local probe="trh-probe-$$"
    ip netns add "$probe" 2>/dev/null ||
        skip "the kernel refuses network namespaces (ip netns add failed)"
    if ! ip -n "$probe" link add tp0 type veth peer name tp1 2>/dev/null; then
        ip netns del "$probe"
        skip "the kernel refuses veth pairs (ip link add type veth failed)"
    fi
    ip netns del "$probe"
}
