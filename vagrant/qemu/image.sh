#!/bin/sh
# The VM check's disk: Debian 12 with its stock kernel, made from the package registries alone (no box download,
# no loop device), shaped like a Vagrant base box (a `vagrant` user with passwordless sudo, sshd, rsync) and no
# more: .ci/setup installs the rest in the guest, as in a user's VM. Cached by this recipe's hash: a changed recipe
# builds a new one.
#
#   sh vagrant/qemu/image.sh DIR     -> DIR/<hash>/{root.img,vmlinuz,initrd.img,id_ed25519}; prints that directory
set -eu
cache=${1:?usage: image.sh CACHE_DIR}
recipe=$(sha256sum "$0" | cut -c1-16)
out="$cache/$recipe"
if [ -f "$out/root.img" ]; then
    echo "$out"
    exit 0
fi
mkdir -p "$cache"
work=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
ssh-keygen -q -t ed25519 -N "" -C mpft-vm-check -f "$work/id_ed25519"
# This machine's outgoing HTTPS may be re-signed by a local authority: the guest trusts what the host trusts.
mkdir -p "$work/ca"
for crt in /usr/local/share/ca-certificates/*.crt; do
    [ -e "$crt" ] && cp "$crt" "$work/ca/"
done
# DHCP on the NAT NIC alone (the MAC check.py gives it), as a base box: a private network's NIC is its user's.
mmdebstrap --quiet --variant=minbase \
    --include=linux-image-amd64,systemd-sysv,udev,openssh-server,sudo,rsync,ca-certificates,iproute2,procps,python3 \
    --customize-hook='echo mpft-vm > "$1/etc/hostname" && printf "127.0.0.1 localhost\n127.0.1.1 mpft-vm\n" > "$1/etc/hosts"' \
    --customize-hook='echo "/dev/vda / ext4 rw,relatime 0 1" > "$1/etc/fstab"' \
    --customize-hook='chroot "$1" useradd --create-home --shell /bin/bash vagrant' \
    --customize-hook='echo "vagrant ALL=(ALL) NOPASSWD: ALL" > "$1/etc/sudoers.d/vagrant"' \
    --customize-hook="install -d -m 700 \"\$1/home/vagrant/.ssh\" && cp $work/id_ed25519.pub \"\$1/home/vagrant/.ssh/authorized_keys\" && chroot \"\$1\" chown -R vagrant:vagrant /home/vagrant/.ssh" \
    --customize-hook='printf "[Match]\nMACAddress=52:54:00:12:34:56\n[Network]\nDHCP=yes\n" > "$1/etc/systemd/network/en.network"' \
    --customize-hook='chroot "$1" systemctl enable systemd-networkd ssh' \
    --customize-hook="cp $work/ca/. \"\$1/usr/local/share/ca-certificates/\" -r && chroot \"\$1\" update-ca-certificates" \
    --customize-hook='printf "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n" > "$1/etc/pip.conf"' \
    --customize-hook="cp \"\$1\"/boot/vmlinuz-* $work/vmlinuz && cp \"\$1\"/boot/initrd.img-* $work/initrd.img" \
    bookworm "$work/tree" http://deb.debian.org/debian
mke2fs -q -t ext4 -L root -d "$work/tree" "$work/root.img" 12G
rm -rf "$work/tree"
mkdir -p "$out"
mv "$work/root.img" "$work/vmlinuz" "$work/initrd.img" "$work/id_ed25519" "$out/"
# An older recipe's image is never used again: only this one stays (each holds a 12 GB sparse disk).
for old in "$cache"/????????????????; do
    [ "$old" = "$out" ] || [ ! -f "$old/root.img" ] || rm -rf "$old"
done
echo "$out"
