"""One class per reason a layer entry is refused (exit 6), as tarfile's filter errors are.

Each carries the entry's name as ``member`` (for a header refused before its name could be
trusted: the name as far as it was read, with the byte offset).  Tests and callers tell them
apart by class, never by parsing messages.
"""

from __future__ import annotations

from cachebake.errors import MemberRefused


# -- the header itself ------------------------------------------------------------------------
class HeaderChecksumError(MemberRefused):
    reason = "has a header whose checksum does not match (tarfile stops reading there, GNU tar skips it)"


class HeaderFormatError(MemberRefused):
    reason = "has a header that is not POSIX ustar"


class NumericFieldError(MemberRefused):
    reason = "has a numeric header field that is not plain octal"


class PaxRecordError(MemberRefused):
    reason = "has a pax extended header record cachebake layers never carry"


# -- entry types ------------------------------------------------------------------------------
class SymlinkError(MemberRefused):
    reason = "is a symbolic link: layers never hold links"


class HardlinkError(MemberRefused):
    reason = "is a hard link: layers never hold links"


class DeviceError(MemberRefused):
    reason = "is a device node"


class FifoError(MemberRefused):
    reason = "is a fifo"


class SparseError(MemberRefused):
    reason = "is a sparse file"


class EntryTypeError(MemberRefused):
    reason = "has a tar entry type cachebake layers never hold"


class SpecialModeError(MemberRefused):
    reason = "has setuid/setgid/sticky bits"


# -- names ------------------------------------------------------------------------------------
class AbsolutePathError(MemberRefused):
    reason = "has an absolute path"


class TraversalError(MemberRefused):
    reason = "climbs out of the tree with '..'"


class BadNameError(MemberRefused):
    reason = "is not a normalized relative path"


class NameTooLongError(MemberRefused):
    reason = "has a path component over NAME_MAX"


class PathTooLongError(MemberRefused):
    reason = "makes a path over PATH_MAX"


class TooDeepError(MemberRefused):
    reason = "nests too many directories deep"


# -- the tree ---------------------------------------------------------------------------------
class OutsideRolesError(MemberRefused):
    reason = "is outside the roles the manifest declares"


class RoleNotDirectoryError(MemberRefused):
    reason = "is a cache role but not a directory"


class DuplicateError(MemberRefused):
    reason = "appears twice"


class BelowFileError(MemberRefused):
    reason = "sits below a regular file"


class FileOverDirectoryError(MemberRefused):
    reason = "is a regular file where earlier entries put a directory"


class NameCollisionError(MemberRefused):
    reason = "collides with another entry under case folding or Unicode normalization"


class OverDeclaredError(MemberRefused):
    reason = "goes past what the manifest declares"
