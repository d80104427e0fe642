"""The sandbox's seccomp filter with ``network = true``: no UNIX sockets of its own.

A sandbox with the network shares the host's network namespace, and with it the host's
*abstract* UNIX sockets (``@/tmp/.X11-unix/X0``, D-Bus, a container runtime's, a debugger's),
which no file system view hides: they are names in the namespace, not files. A command could
connect to any of them. This filter refuses ``socket(AF_UNIX, …)`` (``EAFNOSUPPORT``), so
nothing in the sandbox can connect to, or listen on, a UNIX socket of any kind; a
``socketpair`` (a pipe between two of its own processes, as Python's asyncio makes) is not a
named socket and still works. Without the network the sandbox has a namespace of its own, with
no abstract sockets of the host in it, and needs no filter.

The program is classic BPF, as ``seccomp(2)`` takes it, for the machine's architecture (x86-64
or AArch64); a call from another architecture (a 32-bit program on x86-64, whose socket calls
go through ``socketcall``) is refused whole (``EPERM``), and x32's calls too. bwrap loads it
(``--seccomp FD``) just before it runs the command.
"""

from __future__ import annotations

import os
import platform
import struct

__all__ = ["SeccompUnsupported", "unix_socket_filter", "unix_socket_filter_fd"]

# seccomp_data: the call's number at 0, its architecture at 4, its arguments from 16 (64 bits
# each; the low half of the first at 16 on these little-endian machines).
_NR, _ARCH, _ARG0 = 0, 4, 16
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_EPERM, _EAFNOSUPPORT = 1, 97
_AF_UNIX = 1
_X32_BIT = 0x40000000
# (AUDIT_ARCH_*, the number of ``socket``) by ``platform.machine()``
_ARCHES = {
    "x86_64": (0xC000003E, 41),
    "amd64": (0xC000003E, 41),
    "aarch64": (0xC00000B7, 198),
    "arm64": (0xC00000B7, 198),
}


class SeccompUnsupported(Exception):
    """No filter for this machine's architecture: ``network = true`` cannot close the host's
    abstract UNIX sockets here (the sandbox refuses to start, and says so)."""


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def unix_socket_filter(machine: str | None = None) -> bytes:
    """The filter's program (``struct sock_filter`` entries, native byte order).

    Args:
        machine: The architecture, as ``platform.machine()`` names it (default: this one).

    Returns:
        The program.

    Raises:
        SeccompUnsupported: No filter is written for that architecture.
    """
    name = (machine or platform.machine()).lower()
    if name not in _ARCHES:
        raise SeccompUnsupported(f"no seccomp filter for the {name!r} architecture")
    arch, socket_nr = _ARCHES[name]
    program = [
        _op(_LD_W_ABS, _ARCH),  # 0
        _op(_JEQ_K, arch, jt=0, jf=7),  # 1: another architecture: 9
        _op(_LD_W_ABS, _NR),  # 2
        _op(_JGE_K, _X32_BIT, jt=4, jf=0),  # 3: x32's calls: refused (8)
        _op(_JEQ_K, socket_nr, jt=0, jf=2),  # 4: not socket(): allowed (7)
        _op(_LD_W_ABS, _ARG0),  # 5: its domain
        _op(_JEQ_K, _AF_UNIX, jt=1, jf=0),  # 6: AF_UNIX: refused (8)
        _op(_RET_K, _ALLOW),  # 7
        _op(_RET_K, _ERRNO | _EAFNOSUPPORT),  # 8
        _op(_RET_K, _ERRNO | _EPERM),  # 9
    ]
    return b"".join(program)


def unix_socket_filter_fd() -> int:
    """A file descriptor to read the filter from (``bwrap --seccomp FD``), which the caller
    passes to bwrap and closes once bwrap has started.

    Returns:
        The descriptor, at the program's start, not inherited unless passed.

    Raises:
        SeccompUnsupported: No filter for this architecture.
    """
    program = unix_socket_filter()
    fd = os.memfd_create("durable-agent-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
