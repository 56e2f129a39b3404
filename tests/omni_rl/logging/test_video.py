"""Sample videos: mp4 round trip through PyAV (frames, size, fps, audio), atomic writes, bad
inputs, contact sheets, and the GIF / audio summaries in a TensorBoard event file."""
import io
import os
from fractions import Fraction

import av
import numpy as np
import pytest
import torch
from PIL import Image

from omni_rl.logging import MetricLogger, Sink, TensorBoardSink, contact_sheet, gif_bytes, save_video, video_grid
from omni_rl.utils import atomic


def _flashing(frames=6, height=24, width=32):
    """Frames alternating bright (220) and dark (20), gray so chroma loss cannot blur them."""
    video = np.full((frames, height, width, 3), 20, dtype=np.uint8)
    video[::2] = 220
    return video


def _decode(path):
    """(rgb frames, video stream facts, audio samples or None, audio rate or None) of an mp4."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        facts = {
            "codec": stream.codec_context.name,
            "pix_fmt": stream.codec_context.pix_fmt,
            "rate": stream.average_rate,
            "size": (stream.height, stream.width),
        }
        decoded = list(container.decode(video=0))
    # The colour tags (AVCOL_*_BT709, AVCOL_RANGE_MPEG) tell players how to read the pixels;
    # convert back as they say, explicitly (older PyAV ignores the tags when converting).
    assert {(frame.colorspace, frame.color_range) for frame in decoded} == {(1, 1)}
    bt709 = {"src_colorspace": "ITU709", "src_color_range": "MPEG", "dst_color_range": "JPEG"}
    frames = [frame.reformat(format="rgb24", **bt709).to_ndarray() for frame in decoded]
    samples = rate = None
    with av.open(str(path)) as container:
        if container.streams.audio:
            rate = container.streams.audio[0].rate
            chunks = [frame.to_ndarray() for frame in container.decode(audio=0)]
            samples = np.concatenate(chunks, axis=-1)
    return np.stack(frames), facts, samples, rate


def test_mp4_round_trip_frames_size_fps_and_pixels(tmp_path):
    video = _flashing()
    path = save_video(torch.from_numpy(video), tmp_path / "val" / "step_1.mp4", fps=8)
    frames, facts, samples, _ = _decode(path)
    assert facts == {"codec": "h264", "pix_fmt": "yuv420p", "rate": 8, "size": (24, 32)}
    assert frames.shape == video.shape and samples is None
    # Lossy, but close: CRF 18 on flat gray frames stays within a few levels.
    assert np.abs(frames.astype(int) - video.astype(int)).max() <= 6
    means = frames.reshape(len(frames), -1).mean(axis=1)
    assert (means[::2] > 200).all() and (means[1::2] < 40).all()
    assert [p.name for p in (tmp_path / "val").iterdir()] == ["step_1.mp4"]  # no temporaries left


def test_colour_survives_and_ntsc_rate(tmp_path):
    video = np.zeros((3, 32, 32, 3), dtype=np.uint8)
    video[:, :, :, 0] = 200  # red: a wrong colour matrix would shift it towards orange or pink
    video[:, :, :, 2] = 40
    frames, facts, _, _ = _decode(save_video(video, tmp_path / "red.mp4", fps=30000 / 1001))
    assert facts["rate"] == Fraction(30000, 1001)
    assert np.abs(frames.astype(int) - video.astype(int)).max() <= 6


def test_odd_size_is_padded_to_even(tmp_path):
    video = _flashing(frames=3, height=15, width=21)
    frames, facts, _, _ = _decode(save_video(video, tmp_path / "odd.mp4", fps=4))
    assert facts["size"] == (16, 22) and frames.shape == (3, 16, 22, 3)
    # The extra row and column repeat the edge: the first frame stays bright there too.
    assert frames[0, -1].mean() > 200 and frames[0, :, -1].mean() > 200


@pytest.mark.parametrize("channels", [1, 2])
def test_audio_track_rate_and_duration(tmp_path, channels):
    rate, seconds = 24000, 0.75
    t = np.arange(int(rate * seconds)) / rate
    tone = 0.5 * np.sin(2 * np.pi * 440 * t).astype(np.float32)
    audio = torch.from_numpy(np.stack([tone] * channels)) if channels == 2 else tone
    path = save_video(_flashing(frames=6), tmp_path / "av.mp4", fps=8, audio=audio, sample_rate=rate)
    frames, _, samples, decoded_rate = _decode(path)
    assert len(frames) == 6 and decoded_rate == rate and samples.shape[0] == channels
    # AAC adds a 1024-sample priming frame and pads the last 1024-sample frame.
    assert len(t) <= samples.shape[-1] <= len(t) + 2048
    # A 440 Hz tone at amplitude 0.5 comes back with an RMS near 0.5 / sqrt(2).
    assert abs(np.sqrt(np.mean(samples**2)) - 0.5 / np.sqrt(2)) < 0.05


def test_failed_encode_keeps_the_old_file_and_leaves_nothing(tmp_path, monkeypatch):
    path = save_video(_flashing(), tmp_path / "v.mp4", fps=8)
    before = path.read_bytes()
    real_open = av.open

    class DiesOnThirdMux:
        """The real output container, except that its third `mux` raises."""

        def __init__(self, *args, **kwargs):
            self._container, self._muxed = real_open(*args, **kwargs), 0

        def __getattr__(self, name):
            return getattr(self._container, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            return self._container.__exit__(*exc_info)

        def mux(self, packets):
            self._muxed += 1
            if self._muxed == 3:
                raise RuntimeError("encoder died")
            return self._container.mux(packets)

    monkeypatch.setattr(av, "open", DiesOnThirdMux)
    with pytest.raises(RuntimeError, match="encoder died"):
        save_video(_flashing(frames=4) // 2, path, fps=8)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["v.mp4"]


def test_failed_disk_write_keeps_the_old_file_and_leaves_nothing(tmp_path, monkeypatch):
    path = save_video(_flashing(), tmp_path / "v.mp4", fps=8)
    before = path.read_bytes()

    def fsync_fails(fd):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "fsync", fsync_fails)
    with pytest.raises(OSError, match="disk full"):
        save_video(_flashing(frames=4) // 2, path, fps=8)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["v.mp4"]


def test_bad_inputs_name_the_value_and_what_is_expected(tmp_path):
    path = tmp_path / "bad.mp4"
    good = _flashing(frames=2)
    with pytest.raises(ValueError, match=r"uint8 frames shaped \[T, H, W, 3\].*float32"):
        save_video(good.astype(np.float32) / 255, path, fps=8)
    with pytest.raises(ValueError, match=r"shape \(2, 3, 24, 32\).*permute"):
        save_video(good.transpose(0, 3, 1, 2), path, fps=8)
    with pytest.raises(ValueError, match=r"shape \(24, 32, 3\)"):
        save_video(good[0], path, fps=8)
    with pytest.raises(ValueError, match="empty video"):
        save_video(good[:0], path, fps=8)
    for fps in (0, -1, float("nan"), True, "8"):
        with pytest.raises(ValueError, match=rf"fps must be a positive finite number.*got {fps!r}"):
            save_video(good, path, fps=fps)
    tone = np.zeros(800, np.float32)
    with pytest.raises(ValueError, match="no sample_rate; pass sample_rate="):
        save_video(good, path, fps=8, audio=tone)
    with pytest.raises(ValueError, match=r"one of 96000.*got 12345.*resample"):
        save_video(good, path, fps=8, audio=tone, sample_rate=12345)
    with pytest.raises(ValueError, match=r"float waveform.*int16.*32768"):
        save_video(good, path, fps=8, audio=np.zeros(800, np.int16), sample_rate=16000)
    with pytest.raises(ValueError, match=r"shape \(800, 2\); it looks like \[samples, channels\]"):
        save_video(good, path, fps=8, audio=np.zeros((800, 2), np.float32), sample_rate=16000)
    with pytest.raises(ValueError, match=r"peak of 1\.5.*clamp"):
        save_video(good, path, fps=8, audio=np.full(800, 1.5, np.float32), sample_rate=16000)
    with pytest.raises(ValueError, match="NaN"):
        save_video(good, path, fps=8, audio=np.full(800, np.nan, np.float32), sample_rate=16000)
    assert not path.exists()
    # A sample rate without audio is allowed (video-only samples of an audio-capable model).
    _, _, samples, _ = _decode(save_video(good, path, fps=8, sample_rate=16000))
    assert samples is None


def test_contact_sheet_picks_evenly_spaced_frames():
    # Frame t is filled with value 10 * t, so each tile tells which frame it shows.
    video = np.stack([np.full((16, 16, 3), 10 * t, np.uint8) for t in range(15)])
    sheet = contact_sheet(video, num_frames=3)
    # Tiles enlarged to 128 px (make_grid's min_tile_size), 4 px padding:
    # width 4 + 3 * (128 + 4) = 400, height 4 + 128 + 4 = 136.
    assert isinstance(sheet, Image.Image) and sheet.size == (400, 136)
    shown = [sheet.getpixel((4 + i * 132 + 64, 68))[0] for i in range(3)]
    assert shown == [0, 70, 140]  # frames 0, 7, 14: first, middle, last
    assert contact_sheet(video[:2], num_frames=8).size == (4 + 2 * 132, 136)  # all of a short video
    captioned = contact_sheet(video, num_frames=3, caption="a red fox " * 30)
    assert captioned.width == 400 and captioned.height > 136
    assert np.asarray(captioned)[136:].min() < 128  # caption text drawn (cut to fit)
    big = contact_sheet(np.zeros((4, 720, 1280, 3), np.uint8), num_frames=4)
    assert big.size == (4 + 4 * (455 + 4), 4 + 256 + 4)  # shrunk to 256 px high
    with pytest.raises(ValueError, match="num_frames"):
        contact_sheet(video, num_frames=0)


def test_video_grid_one_row_per_sample():
    videos = torch.zeros(3, 10, 16, 16, 3, dtype=torch.uint8)
    one = contact_sheet(videos[0], num_frames=4)
    grid = video_grid(videos, captions=["a", "b", "c"], num_frames=4)
    assert grid.width == 4 + one.width + 4 and grid.height > 3 * one.height
    side_by_side = video_grid(list(videos), nrow=3, num_frames=4)
    assert side_by_side.size == (4 + 3 * (one.width + 4), 4 + one.height + 4)
    with pytest.raises(ValueError, match="2 captions for 3 videos"):
        video_grid(videos, captions=["a", "b"])
    with pytest.raises(ValueError, match=r"one size.*\(16, 16, 8\), \(16, 20, 8\)"):
        video_grid([videos[0], torch.zeros(10, 16, 20, 3, dtype=torch.uint8)])
    with pytest.raises(ValueError, match=r"\[B, T, H, W, 3\].*wrap a single video"):
        video_grid(videos[0])


def test_gif_bytes_frames_and_delay():
    with Image.open(io.BytesIO(gif_bytes(_flashing(frames=5), fps=10))) as gif:
        assert gif.format == "GIF" and gif.n_frames == 5 and gif.size == (32, 24)
        assert gif.info["duration"] == 100 and gif.info["loop"] == 0
    with Image.open(io.BytesIO(gif_bytes(_flashing(frames=2), fps=120))) as gif:
        assert gif.info["duration"] == 20  # capped: browsers slow shorter delays to 100 ms


def test_tensorboard_video_and_audio_summaries(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import AUDIO, IMAGES, EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    recorder = []

    class ImagesOnly(Sink):  # a sink without videos or audio: skipped, as for images
        media = frozenset({"image"})

        def log(self, metrics, step):
            pass

        def add_image(self, tag, image, step):
            recorder.append(tag)

        def close(self):
            pass

    with MetricLogger([sink, ImagesOnly()]) as logger:
        logger.log_video("val/video", torch.from_numpy(_flashing(frames=4)), fps=8, step=3)
        logger.log_audio("val/audio", torch.zeros(2, 1600), sample_rate=16000, step=3)
        with pytest.raises(ValueError, match=r"add_video\('val/video'\) expects uint8"):
            logger.log_video("val/video", np.zeros((4, 8, 8, 3), np.float32), fps=8, step=4)
        with pytest.raises(ValueError, match=r"add_video\('val/video'\) fps"):
            logger.log_video("val/video", _flashing(frames=2), fps=0, step=4)
    assert recorder == []

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={IMAGES: 0, AUDIO: 0})
    events.Reload()
    (image,) = events.Images("val/video")
    assert (image.step, image.width, image.height) == (3, 32, 24)
    with Image.open(io.BytesIO(image.encoded_image_string)) as gif:
        assert gif.format == "GIF" and gif.n_frames == 4
    (sound,) = events.Audio("val/audio")
    assert (sound.step, sound.sample_rate, sound.length_frames) == (3, 16000, 1600)
