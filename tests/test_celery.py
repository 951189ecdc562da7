"""The Celery worker pool: settings, routing, task identity, and real workers on a real Redis broker producing
exactly what the local executor produces, surviving an orchestrator restart, recycling and time limits."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from gcis_etl.config import load_config
from gcis_etl.distributed import CelerySettings
from gcis_etl.errors import ConfigError
from gcis_etl.executors import LocalExecutor
from gcis_etl.harvesting import harvest
from gcis_etl.pipelines import Pipeline
from gcis_etl.recipes import load_recipe
from gcis_etl.settings import parse
from gcis_etl.work import Outcome
from gcis_etl.worker import CeleryExecutor, celery_task_id
from tests.broker import (Pool, assert_harvests_agree, assert_no_stray_conversion_children, expected_outcome,
                          make_masters, pool_config, received, run_all, slow_master, store_contents, tasks_of)


def comparable(results) -> dict:
    """Results by item, without timings."""
    return {r.item_id: {k: v for k, v in r.to_dict().items() if k != "seconds"} for r in results}


def maps_libvips(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return any("libvips" in line for line in f)


# ----------------------------------------------------------------------------------------------- settings


def test_settings_are_validated_with_the_key_named():
    with pytest.raises(ConfigError, match=r"celery\.time_limits\.default.*soft_seconds \(50\) must be less"):
        parse(CelerySettings, {"time_limits": {"default": {"soft_seconds": 50, "hard_seconds": 40}}},
              "config.yaml", "celery")
    with pytest.raises(ConfigError, match=r"celery\.result_backend: .*rpc:// cannot"):
        parse(CelerySettings, {"result_backend": "rpc://"}, "config.yaml", "celery")
    with pytest.raises(ConfigError, match=r"result_backend: required when the broker is not Redis"):
        parse(CelerySettings, {"broker_url": "amqp://guest@rabbit:5672//"}, "config.yaml", "celery")
    with pytest.raises(ConfigError, match=r"visibility_timeout_seconds must exceed .* \(7200\)"):
        parse(CelerySettings, {"time_limits": {"default": {}, "slow": {"soft_seconds": 6000, "hard_seconds": 7200}}},
              "config.yaml", "celery")
    # retries wait out their backoff inside the task: it is held no longer than its hard limit
    assert parse(CelerySettings, {"visibility_timeout_seconds": 3601, "retry": {"backoff_max_seconds": 300}},
                 "config.yaml", "celery").visibility_timeout_seconds == 3601
    with pytest.raises(ConfigError, match=r"result_expires_hours \(4\) must exceed twice visibility_timeout_seconds"):
        parse(CelerySettings, {"result_expires_hours": 4}, "config.yaml", "celery")
    with pytest.raises(ConfigError, match=r"celery\.broker_url: .*Redis or RabbitMQ"):
        parse(CelerySettings, {"broker_url": "sqs://"}, "config.yaml", "celery")


def test_a_password_in_a_broker_url_is_masked_when_the_settings_are_printed():
    settings = CelerySettings(broker_url="amqp://gcis:s3cret@rabbit:5672//", result_backend="redis://:pw@redis:6379/1")
    dumped = settings.model_dump(mode="json")
    assert dumped["broker_url"] == "amqp://gcis:***@rabbit:5672//"
    assert dumped["result_backend"] == "redis://:***@redis:6379/1"
    assert settings.celery_conf()["broker_url"] == "amqp://gcis:s3cret@rabbit:5672//"  # the real one is used
    assert settings.celery_conf()["broker_transport_options"] == {}  # Redis' redelivery options only for Redis


def test_jpeg2000_recipes_go_to_their_own_queue_by_default_and_routes_can_name_recipes():
    settings = CelerySettings()
    assert settings.queue_for(load_recipe("ptiff-jpeg-q90")) == "gcis"
    assert settings.queue_for(load_recipe("jp2-openjpeg-lossy")) == "gcis-jp2"
    assert settings.queue_for(load_recipe("jp2-kakadu-lossless")) == "gcis-jp2"
    routed = CelerySettings(queues={"big": {"recipes": ["ptiff-jpeg-q90-444"]}, "jp2": {"encoders": ["grok"]}},
                            time_limits={"default": {}, "jp2-grok-lossy": {"soft_seconds": 10, "hard_seconds": 20}})
    assert routed.queue_for(load_recipe("ptiff-jpeg-q90-444")) == "big"
    assert routed.queue_for(load_recipe("jp2-grok-lossy")) == "jp2"
    assert routed.queue_for(load_recipe("jp2-openjpeg-lossy")) == "gcis"
    assert routed.limits_for(load_recipe("jp2-grok-lossy")).hard_seconds == 20
    assert routed.limits_for(load_recipe("ptiff-jpeg-q90")).hard_seconds == 3600


def test_the_config_file_carries_the_celery_section(tmp_path):
    config = pool_config(tmp_path / "config.yaml", masters=tmp_path, broker_url="redis://127.0.0.1:1/3",
                         store={"kind": "local", "root": str(tmp_path / "store")})
    assert load_config(config).celery.results_url == "redis://127.0.0.1:1/3"
    config.write_text(config.read_text().replace("poll_seconds: 0.1", "poll_seconds: 0"))
    with pytest.raises(ConfigError, match=r"celery\.poll_seconds"):
        load_config(config)


def test_a_worker_with_a_broken_config_says_what_is_wrong_and_stops(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("celery:\n  time_limits: {default: {soft_seconds: 9, hard_seconds: 5}}\n")
    celery = Path(sys.executable).parent / "celery"
    done = subprocess.run([str(celery), "-A", "gcis_etl.worker", "worker"], capture_output=True, text=True,
                          env=dict(os.environ, GCIS_CONFIG=str(config)), timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"configuration error:\n{config}: celery.time_limits.default: "
                                   f"soft_seconds (9) must be less than hard_seconds (5)")


def test_a_conversion_process_given_one_libvips_thread_encodes_tiles_in_its_decoding_thread(tmp_path):
    """One pool process per core scales only if a conversion keeps to one core (isolation.vips_concurrency 1):
    no tile-encoding thread beside the decoder then; more libvips threads let the recipe's encode_threads run.
    The access master is the same file either way."""
    from gcis_etl.conversion import convert
    from gcis_etl.isolation import IsolatedProcess
    from gcis_etl.models import Status
    from gcis_etl.policy import IsolationSettings
    recipe = load_recipe("ptiff-jpeg-q90")
    master = slow_master(tmp_path / "master.tif", size=1500)
    outputs = {}
    for threads in (1, 2):
        with IsolatedProcess(IsolationSettings(vips_concurrency=threads)) as child:
            outputs[threads] = convert(master, tmp_path / f"out-{threads}.tif", recipe, worker=child)
            encode_threads = child.call("gcis_etl.ptiff.encode_threads", recipe)
        assert encode_threads == (0 if threads == 1 else recipe.encode_threads)
    assert outputs[1].status is outputs[2].status is Status.CONVERTED
    assert outputs[1].sha256 == outputs[2].sha256


def test_task_ids_are_the_same_for_the_same_work_only(tmp_path):
    masters = make_masters(tmp_path / "masters", 1, 2)
    config = load_config(pool_config(tmp_path / "config.yaml", masters=masters, broker_url="redis://127.0.0.1:1/0",
                                     store={"kind": "local", "root": str(tmp_path / "store")}))
    first, second = tasks_of(config.pipeline("demo"))
    again = tasks_of(config.pipeline("demo"))[0]
    assert celery_task_id(first) == celery_task_id(again)
    assert celery_task_id(first) != celery_task_id(second)
    assert celery_task_id(first) != celery_task_id(replace(first, attempt=2))
    assert celery_task_id(first) != celery_task_id(replace(first, recipe_digest="0" * 16))
    changed = replace(first, item=replace(first.item, size=first.item.size + 1))
    assert celery_task_id(first) != celery_task_id(changed)


# ------------------------------------------------------------------------------------------ real workers


@pytest.fixture
def pool(tmp_path, minio, redis_server, celery_workers, aws_env) -> Pool:
    """Three objects of three small masters each, two of them with a master no decoder accepts."""
    masters = make_masters(tmp_path / "masters", objects=3, per_object=3, rejected=2)
    return Pool(tmp_path, minio, redis_server, masters, celery_workers)


def executor(config_file: Path, window: int) -> tuple[CeleryExecutor, Pipeline]:
    config = load_config(config_file)
    pipeline = config.pipeline("demo")
    return CeleryExecutor({"demo": pipeline}, window, config.state_dir / "scratch", config.celery), pipeline


def test_two_workers_produce_exactly_what_the_local_executor_produces(pool):
    celery_config, local_config = pool.config("celery"), pool.config("local")
    workers = [pool.start("w1", celery_config), pool.start("w2", celery_config)]
    celery_executor, celery_pipeline = executor(celery_config, 4)
    local_pipeline = load_config(local_config).pipeline("demo")

    by_celery = run_all(celery_executor, tasks_of(celery_pipeline))
    by_local = run_all(LocalExecutor({"demo": local_pipeline}, 2, pool.tmp / "scratch"), tasks_of(local_pipeline))

    assert len(by_celery) == len(by_local) == 11
    assert comparable(by_celery) == comparable(by_local)
    assert {r.outcome for r in by_celery} == {Outcome.DEPOSITED, Outcome.REJECTED}
    assert store_contents(celery_pipeline.store) == store_contents(local_pipeline.store)
    assert all(w.log_text().count("] received") > 0 for w in workers)  # both took work

    for worker in workers:  # libvips only ever in the conversion children, never in a forked process
        main = worker.proc.pid
        pool_processes = [p for p in worker.processes() if p.ppid() == main]
        assert pool_processes and not maps_libvips(main)
        assert not any(maps_libvips(p.pid) for p in pool_processes)
        conversion = [p for p in worker.processes() if p.ppid() in {q.pid for q in pool_processes}
                      and "_child_main" in " ".join(p.cmdline())]
        assert conversion and all(maps_libvips(p.pid) for p in conversion)


def test_a_harvest_through_celery_records_the_same_ledger_and_store_as_a_local_harvest(pool):
    assert_harvests_agree(pool)


def test_jpeg2000_work_reaches_only_the_workers_of_its_queue(pool):
    config = pool.config("routes")
    light, heavy = pool.start("light", config, "-Q", "gcis"), pool.start("heavy", config, "-Q", "gcis-jp2")
    route_executor, pipeline = executor(config, 4)
    ptiff_task, jp2_task = tasks_of(pipeline)[:2]
    jp2 = load_recipe("jp2-openjpeg-lossy")
    jp2_task = replace(jp2_task, recipe=jp2.name, recipe_digest=jp2.digest)
    results = {r.item_id: r for r in run_all(route_executor, [ptiff_task, jp2_task])}

    assert results[jp2_task.item.id].outcome is Outcome.DEPOSITED and results[jp2_task.item.id].key.endswith(".jp2")
    assert results[ptiff_task.item.id].outcome is Outcome.DEPOSITED
    assert received([heavy], celery_task_id(jp2_task)) == 1 and received([light], celery_task_id(jp2_task)) == 0
    assert received([light], celery_task_id(ptiff_task)) == 1 and received([heavy], celery_task_id(ptiff_task)) == 0


def test_a_restarted_orchestrator_takes_recorded_outcomes_and_waits_for_running_tasks(pool):
    config = pool.config("celery")
    first, pipeline = executor(config, 100)
    tasks = tasks_of(pipeline)
    for task in tasks:  # sent while no worker runs: all queued; then the orchestrator dies
        assert first.submit(task) == []
    workers = [pool.start("w1", config), pool.start("w2", config)]

    results = run_all(executor(config, 3)[0], tasks)
    assert sorted(r.item_id for r in results) == sorted(t.item.id for t in tasks)
    assert all(received(workers, celery_task_id(t)) == 1 for t in tasks)  # none sent twice

    # Outcomes handed over are forgotten: asking again (a deliberate re-run) runs the tasks again, and
    # the store recognises the outputs instead of converting them again.
    again = run_all(executor(config, 3)[0], tasks)
    assert all(received(workers, celery_task_id(t)) == 2 for t in tasks)
    deposited = [r for r in again if r.outcome is Outcome.DEPOSITED]
    assert len(deposited) == 9 and all("already in the store" in r.warnings[0] for r in deposited)
    recognised = {item: {**result, "warnings": [], "master_sha256": None} for item, result in comparable(again).items()}
    assert recognised == {item: {**result, "warnings": [], "master_sha256": None}
                          for item, result in comparable(results).items()}


def test_a_harvest_after_a_killed_one_takes_the_outcomes_it_left_and_publishes_every_manifest(pool):
    """The killed run's outcomes wait in the result backend: the next run gets each back as it submits the item,
    while the object's other items are still to be planned. The object is settled once, when all are."""
    manifests = {"manifest_base_url": "http://127.0.0.1:8182/store", "image_service_base_url": "http://127.0.0.1/iiif"}
    config = pool.config("rerun", pipeline={"executor": "celery", "concurrency": 4, "manifests": manifests})
    killed, pipeline = executor(config, 100)
    tasks = tasks_of(pipeline)
    for task in tasks:
        killed.submit(task)
    pool.start("w1", config)
    while any(killed.app.backend.get_task_meta(celery_task_id(t))["status"] != "SUCCESS" for t in tasks):
        time.sleep(0.1)
    killed.close()  # its outcomes were never read

    report = harvest(load_config(config), "demo")
    assert report.status == "completed"
    assert (report.counts["deposited"], report.counts["rejected"], report.manifests) == (9, 2, 3)


def test_a_pool_process_serving_several_pipelines_keeps_one_conversion_child(pool):
    """Each conversion child may grow to its isolation.max_rss_mb: one per pool process, not one per pipeline
    served; a pipeline with other isolation settings gets a new one in its place."""
    config = pool.config("pipelines")
    document = yaml.safe_load(config.read_text())
    demo = document["pipelines"]["demo"]
    document["pipelines"]["same"] = demo
    document["pipelines"]["other"] = {**demo, "isolation": {"max_jobs_per_process": 50}}
    config.write_text(yaml.safe_dump(document))
    worker = pool.start("w1", config)
    settings = load_config(config)
    for name in ("demo", "other", "same"):
        pipeline = settings.pipeline(name)
        batch = tasks_of(pipeline)[:2]
        results = run_all(CeleryExecutor({name: pipeline}, 2, Path("unused"), settings.celery), batch)
        assert [r.outcome for r in results] == [Outcome.DEPOSITED] * 2

    conversion = [p for p in worker.processes() if "_child_main" in " ".join(p.cmdline())]
    assert len(conversion) == 1
    assert_no_stray_conversion_children(worker)


@pytest.mark.parametrize("limit, tasks, processes", [
    ({"worker_max_tasks_per_child": 2}, 5, 3),
    ({"worker_max_memory_per_child_mb": 1}, 3, 3),  # every pool process is larger than 1 MB after a task
])
def test_a_worker_recycles_its_pool_process_at_its_limit_without_losing_work(pool, limit, tasks, processes):
    config = pool.config("recycle", **limit)
    worker = pool.start("w1", config)
    pool_executor, pipeline = executor(config, 4)
    batch = tasks_of(pipeline)[:tasks]
    results = run_all(pool_executor, batch)

    assert sorted(r.item_id for r in results) == sorted(t.item.id for t in batch)
    assert all(r.outcome is expected_outcome(r.item_id) for r in results)
    assert len(set(worker.pool_pids())) >= processes
    assert_no_stray_conversion_children(worker)


def test_the_soft_time_limit_of_a_recipe_fails_the_item_and_stops_its_conversion(pool):
    masters = pool.tmp / "slow-masters"
    slow_master(masters / "big" / "a.tif", size=6000)
    for sample in ("p00.tif", "p01.tiff"):
        (masters / "big" / sample).write_bytes((pool.masters / "obj00" / sample).read_bytes())
    config = pool.config("soft", masters=masters, time_limits={
        "default": {"soft_seconds": 10, "hard_seconds": 12},
        "ptiff-jpeg-q90-444": {"soft_seconds": 1, "hard_seconds": 12}})
    worker = pool.start("w1", config)
    soft_executor, pipeline = executor(config, 1)
    big, *small = tasks_of(pipeline)
    recipe = load_recipe("ptiff-jpeg-q90-444")
    big = replace(big, recipe=recipe.name, recipe_digest=recipe.digest)
    results = {r.item_id: r for r in run_all(soft_executor, [big, *small])}

    failed = results["big/a.tif"]
    assert failed.outcome is Outcome.FAILED and not failed.transient
    assert failed.reason == "took longer than the soft time limit of 1 s for recipe ptiff-jpeg-q90-444"
    # the next tasks got their own outputs, not a late reply of the stopped conversion
    assert (results["big/p00.tif"].width, results["big/p00.tif"].height) == (128, 128)
    assert (results["big/p01.tiff"].width, results["big/p01.tiff"].height) == (157, 151)
    assert sorted(store_contents(pipeline.store)) == sorted(r.key for r in results.values() if r.key)
    assert_no_stray_conversion_children(worker)
