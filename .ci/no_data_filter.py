"""sitecustomize for the CI job that runs without PEP 706: make this Python's tarfile look like
CPython 3.11.2's (Debian 12's), which predates ``tarfile.data_filter`` (added in 3.11.4).

Installed as ``sitecustomize.py`` in a directory put on PYTHONPATH by .ci/run, so every Python
process of the job (the tests' subprocesses included) sees the same tarfile.  Removes the
filter functions, their errors and ``TarFile.extraction_filter``, and makes ``extract``/
``extractall`` refuse a ``filter`` argument as 3.11.2 does (a TypeError).
"""

import functools
import tarfile

for _name in ("data_filter", "tar_filter", "fully_trusted_filter", "FilterError",
              "AbsolutePathError", "OutsideDestinationError", "SpecialFileError",
              "AbsoluteLinkError", "LinkOutsideDestinationError"):
    if hasattr(tarfile, _name):
        delattr(tarfile, _name)
if "extraction_filter" in vars(tarfile.TarFile):
    delattr(tarfile.TarFile, "extraction_filter")


def _no_filter_argument(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if "filter" in kwargs:
            raise TypeError(f"{method.__name__}() got an unexpected keyword argument 'filter'")
        return method(self, *args, **kwargs)

    return wrapper


tarfile.TarFile.extract = _no_filter_argument(tarfile.TarFile.extract)
tarfile.TarFile.extractall = _no_filter_argument(tarfile.TarFile.extractall)
