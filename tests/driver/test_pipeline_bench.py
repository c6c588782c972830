"""`npu bench pipeline` on few frames: the JSON it prints and its frame accounting (figures are the
bench command's to measure, not a test's)."""

import json

from npu.cli import main


def test_bench_pipeline_json(capsys, monkeypatch):
    import npu.driver.pipeline.bench as b

    real = b.bench_pipeline
    monkeypatch.setattr(b, "bench_pipeline", lambda **kw: real(frames_n=6, ms=5.0, **kw))
    assert main(["bench", "pipeline", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res["scaling"]["fps"]) == {"1", "2", "4"} and all(
        v > 0 for v in res["scaling"]["fps"].values()
    )
    assert set(res["standalone_fps"]) == {"load", "accelerator", "upload"}
    assert res["overlap"] > 0 and res["speedup"] > 0
    assert res["lost"] == 0 and res["duplicated"] == 0
