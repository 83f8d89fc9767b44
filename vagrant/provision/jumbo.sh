#!/bin/sh
# Jumbo frames on the private network (its /24 prefix, the argument, e.g. 192.168.56): VXLAN between servers
# carries the fabric's 9000-byte frames whole. For Vagrant (the "jumbo" provisioner of several VMs, at every boot)
# and `make vm-check` (the guest as a second server).
set -eu
net=${1:?usage: jumbo.sh PREFIX}
dev=$(ip -o -4 addr show to "$net.0/24" | cut -d' ' -f2)
ip link set dev "$dev" mtu 9100
