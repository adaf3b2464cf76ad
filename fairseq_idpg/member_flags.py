"""The flags in which the runs of a fused group differ: each member's own ``--lr``, ``--seed`` and ``--save-dir``;
every other fairseq-train flag is the group's, given once. A leaf, read by the group's launcher
(``run/group.py``), the fused trainer (``fused/train.py``) and the launch counter (``launches.py``)."""

import os

MEMBER_FLAGS = ("--lr", "--seed", "--save-dir")


def split_own(args):
    """(a run's fairseq-train arguments without its ``MEMBER_FLAGS``, those flags as ``[--lr X --seed Y --save-dir
    Z]``): the group's shared flags and one ``--member``'s. The one parser of a member's flags: the group's
    launcher splits its runs' commands with it, the fused trainer its ``--member`` values."""
    rest, own, i = [], {}, 0
    while i < len(args):
        if args[i] in MEMBER_FLAGS and i + 1 < len(args):
            own[args[i]] = args[i + 1]
            i += 2
        else:
            rest.append(args[i])
            i += 1
    missing = [flag for flag in MEMBER_FLAGS if flag not in own]
    if missing:
        from fairseq_idpg.errors import ConfigError

        raise ConfigError(f"{', '.join(missing)} missing: each member gives its own {', '.join(MEMBER_FLAGS)}")
    return rest, [x for flag in MEMBER_FLAGS for x in (flag, own[flag])]


def shared_folders(members):
    """The ``--save-dir`` values of ``members`` (each ``[--lr X --seed Y --save-dir Z]``) that name a folder another
    member names too, however it is spelled (``a``, ``a/``, ``./a``, a symlink to it), in the members' order: two
    members in one folder would overwrite each other's checkpoints and results. [] when every member has its own."""
    dirs = [os.path.realpath(m[m.index("--save-dir") + 1]) for m in members]
    said = [m[m.index("--save-dir") + 1] for m, d in zip(members, dirs, strict=True) if dirs.count(d) > 1]
    return list(dict.fromkeys(said))
