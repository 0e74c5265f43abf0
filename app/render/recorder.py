"""Record the viewer to an H.264 mp4 (PyAV) and a PNG still of the last frame (pillow).

Frames are drawn into the viewer's own framebuffer at its size (rounded down to even numbers, which
yuv420p needs), so recording works headless and never reads the window. Output goes to a hidden
`.NAME.*.part` file in the target directory and is `os.replace()`d into place only when complete: a
failure or Ctrl-C never leaves a file that looks finished (the partial file is deleted).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from app.errors import ConfigError, RuntimeFault


@dataclass
class RecordResult:
    path: Path
    still: Path | None
    frames: int
    size: tuple[int, int]  # (width, height)
    seconds: float  # wall time spent


def even_size(size) -> tuple[int, int]:
    w, h = (int(s) for s in size)
    return max(w - w % 2, 2), max(h - h % 2, 2)


def _partial_file(target: Path, what: str) -> Path:
    """Create an empty hidden partial file beside `target`; RuntimeFault with one clear line if we can't."""
    directory = target.parent
    if not directory.exists():
        raise RuntimeFault(f"cannot write {what} {target}: directory {directory} does not exist")
    if not directory.is_dir():
        raise RuntimeFault(f"cannot write {what} {target}: {directory} is not a directory")
    if target.is_dir():
        raise RuntimeFault(f"cannot write {what} {target}: it is a directory")
    for _ in range(100):
        name = directory / f".{target.name}.{secrets.token_hex(4)}.part"
        try:  # mode 0o666 through the umask, like the finished file should have (mkstemp would give 0o600)
            fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            continue
        except OSError as e:
            raise RuntimeFault(f"cannot write {what} {target}: directory {directory} is not writable "
                               f"({e.strerror or e})") from e
        os.close(fd)
        return name
    raise RuntimeFault(f"cannot write {what} {target}: no free temporary name in {directory}")


def _unlink(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def record(viewer, out_path, frames: int, fps: float = 30, still_path=None, progress: bool = True,
           step: bool = True, crf: int = 18, preset: str = "fast") -> RecordResult:
    """Render `frames` frames (advancing the simulation before each when `step`) into `out_path` (mp4).

    `still_path`: also write the last frame as a PNG there. Raises RuntimeFault for an unwritable target.
    """
    import av
    from PIL import Image
    from tqdm import tqdm

    frames = int(frames)
    if frames < 1:
        raise ConfigError(f"record: frames must be >= 1 (got {frames})")
    if not fps or fps <= 0:
        raise ConfigError(f"record: fps must be > 0 (got {fps})")
    out_path = Path(out_path).expanduser().resolve()
    still_path = Path(still_path).expanduser().resolve() if still_path is not None else None
    w, h = even_size(viewer.physical_size)

    t0 = time.perf_counter()
    tmp_video = _partial_file(out_path, "video")
    tmp_still = None
    container = None
    try:
        if still_path is not None:
            tmp_still = _partial_file(still_path, "still")
        container = av.open(str(tmp_video), mode="w", format="mp4")
        stream = container.add_stream("libx264", rate=round(fps) if float(fps).is_integer() else fps)
        stream.width, stream.height = w, h
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(int(crf)), "preset": preset}
        img = None
        bar = tqdm(range(frames), desc=f"recording {out_path.name}", unit="frame", disable=not progress,
                   leave=False)
        for _ in bar:
            if step:
                viewer.advance()
            img = viewer.render_to_array((w, h))
            frame = av.VideoFrame.from_ndarray(img, format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
        container.close()
        container = None
        if tmp_still is not None:
            Image.fromarray(img).save(tmp_still, format="PNG")
            os.replace(tmp_still, still_path)
            tmp_still = None
        os.replace(tmp_video, out_path)
        tmp_video = None
    except OSError as e:
        raise RuntimeFault(f"recording {out_path} failed: {e.strerror or e}") from e
    finally:
        if container is not None:
            with contextlib.suppress(Exception):
                container.close()
        _unlink(tmp_video)
        _unlink(tmp_still)
    return RecordResult(out_path, still_path, frames, (w, h), time.perf_counter() - t0)
