"""A folder laid out as the kubelet mounts a ConfigMap: each version of the files in a
timestamped folder, `..data` a link to the current one, and each file a link through
`..data`. An update writes the next version beside it and swaps `..data` atomically."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class ConfigMapVolume:
    def __init__(self, root: Path, files: dict[str, str]) -> None:
        self.root = root
        self._versions = 0
        current = self._write_version(files)
        os.symlink(current.name, root / "..data")
        for name in files:
            os.symlink(f"..data/{name}", root / name)

    def update(self, files: dict[str, str], *, same_times: bool = False) -> None:
        """Swap in `files` as the kubelet does, then remove the old version. `same_times`
        gives each new file its predecessor's modification time."""
        old = (self.root / "..data").resolve()
        new = self._write_version(files)
        if same_times:
            for name in files:
                stat = (old / name).stat()
                os.utime(new / name, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        staged = self.root / "..data_tmp"
        os.symlink(new.name, staged)
        os.replace(staged, self.root / "..data")
        shutil.rmtree(old)

    def _write_version(self, files: dict[str, str]) -> Path:
        self._versions += 1
        folder = self.root / f"..2026_12_03_00_00_0{self._versions}.000000001"
        folder.mkdir()
        for name, text in files.items():
            (folder / name).write_text(text)
        return folder
