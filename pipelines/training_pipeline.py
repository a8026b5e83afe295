"""The reference training pipeline (KFP v2), composed from the six KFP faces.

validate → snapshot → train → (profile ∥ evaluate) → if the gate passed: register.
Every task has a retry policy with exponential backoff, a timeout, and the
resources of one hardware profile. Importing this module loads kfp only.
"""

# No `from __future__ import annotations`: KFP reads the real annotations.

from typing import Any

from kfp import dsl
from kfp.dsl import Dataset

from trainpipe.components.evaluate_model.kfp_component import evaluate_model
from trainpipe.components.profile_training.kfp_component import profile_training
from trainpipe.components.register_model.kfp_component import register_model
from trainpipe.components.snapshot_dataset.kfp_component import snapshot_dataset
from trainpipe.components.train_model.kfp_component import train_model
from trainpipe.components.validate_data.kfp_component import validate_data
from trainpipe.faces.kfp_face import accelerated
from trainpipe.images import RUN_AS
from trainpipe.profiles import PROFILES, HardwareProfile, Resources

PIPELINE_NAME = "trainpipe-training"


def _configure(task: Any, res: Resources, profile: HardwareProfile, caching: bool = True) -> Any:
    task.set_cpu_request(res.cpu_request).set_cpu_limit(res.cpu_limit)
    task.set_memory_request(res.memory_request).set_memory_limit(res.memory_limit)
    if res.accelerator_type and res.accelerator_count:
        task.set_accelerator_type(res.accelerator_type).set_accelerator_limit(res.accelerator_count)
    # trainpipe's images run as UID/GID 10001; KFP's compiler adds allowPrivilegeEscalation: false,
    # drops every capability and sets seccompProfile RuntimeDefault (Pod Security "restricted").
    from kfp import kubernetes

    kubernetes.set_security_context(task, run_as_user=RUN_AS, run_as_group=RUN_AS, run_as_non_root=True)
    # backoff_max_duration is the cap on one wait, chosen on purpose: KFP's default
    # (3600 s) is the same, but we say it so nobody has to guess.
    task.set_retry(num_retries=profile.retries, backoff_duration=f"{profile.retry_backoff_s}s", backoff_factor=2.0, backoff_max_duration="600s")
    task.set_caching_options(caching)
    return task


def _kubernetes_settings(profile: HardwareProfile, trained: Any, tasks: list[Any]) -> None:
    """The profile's cluster settings through kfp-kubernetes: scheduling, images, secrets, timeouts."""
    from kfp import kubernetes

    for task in tasks:
        for key, value in profile.node_selector.items():
            kubernetes.add_node_selector(task, label_key=key, label_value=value)
        if profile.node_affinity:
            kubernetes.add_node_affinity(task, match_expressions=profile.node_affinity)
        kubernetes.set_image_pull_policy(task, profile.image_pull_policy)
        if profile.image_pull_secrets:
            kubernetes.set_image_pull_secrets(task, profile.image_pull_secrets)
        for secret, keys in sorted(profile.secrets_as_env.items()):
            # only the secret's name and keys are compiled in; Kubernetes injects the values
            kubernetes.use_secret_as_env(task, secret_name=secret, secret_key_to_env=keys)
        kubernetes.set_timeout(task, profile.train_timeout_s if task is trained else profile.timeout_s)
    for tol in profile.tolerations:
        kubernetes.add_toleration(trained, key=tol.key, operator=tol.operator, value=tol.value, effect=tol.effect)
    for pvc, path in sorted(profile.volumes.items()):
        kubernetes.mount_pvc(trained, pvc_name=pvc, mount_path=path)


def build_pipeline(profile: HardwareProfile, policy: Any = None, pipeline_root: str | None = None) -> Any:
    """The reference pipeline with one hardware profile's settings.

    Args:
        profile: Resources, scheduling and retries of every step.
        policy: A non-empty :class:`~trainpipe.contract.policy.Policy` goes onto every task as
            ``TRAINPIPE_POLICY`` (rules only: it holds no secret).
        pipeline_root: Where KFP keeps the run's artifacts (default: the cluster's).
    """
    train_op = accelerated(train_model) if profile.train.accelerated else train_model
    from trainpipe.contract.policy import ENV as POLICY_ENV, to_env

    policy_json = to_env(policy) if policy is not None else "{}"

    @dsl.pipeline(name=PIPELINE_NAME, description="Validate, snapshot, train, profile, evaluate and register a model.", pipeline_root=pipeline_root)
    def training_pipeline(
        raw_data_uri: str,
        dvc_repo_dir: str,
        dvc_remote_url: str,
        tracking_uri: str,
        label_column: str = "label",
        suite: str = "builtin:default",
        dataset_name: str = "dataset",
        experiment_name: str = "trainpipe",
        model_name: str = "trainpipe-model",
        alias: str = "champion",
        thresholds: dict = {"accuracy": 0.8},
        backend: str = "torch_ddp",
        model_arch: str = "mlp",
        precision: str = "fp32",
        nproc_per_node: int = 2,
        device: str = "auto",
        epochs: int = 10,
        batch_size: int = 64,
        learning_rate: float = 0.05,
        hidden_units: list = [64],
        test_fraction: float = 0.2,
        seed: int = 0,
        max_restarts: int = 3,
        checkpoint_every_steps: int = 50,
    ):
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        raw = dsl.importer(artifact_uri=raw_data_uri, artifact_class=Dataset, reimport=False)
        raw.set_display_name("raw-data")
        validated = validate_data(raw_data=raw.output, label_column=label_column, suite=suite, run_id=run_id)
        # validate and snapshot read data that can change behind the same URI: never cached
        # (the snapshot is content-addressed and idempotent, so rerunning it is cheap). Every
        # later data-consuming task takes the snapshot's DVC md5 as a parameter, so its cache
        # key includes the content hash and new data never hits a stale cache.
        snap = snapshot_dataset(
            validated=validated.outputs["validated"],
            repo_dir=dvc_repo_dir,
            remote_url=dvc_remote_url,
            dataset_name=dataset_name,
            run_id=run_id,
        )
        trained = train_op(
            snapshot=snap.outputs["snapshot"],
            dataset_md5=snap.outputs["md5"],
            label_column=label_column,
            backend=backend,
            model_arch=model_arch,
            precision=precision,
            nproc_per_node=nproc_per_node,
            device=device,
            epochs=epochs,
            batch_size=batch_size,
            learning_rate=learning_rate,
            hidden_units=hidden_units,
            test_fraction=test_fraction,
            seed=seed,
            max_restarts=max_restarts,
            checkpoint_every_steps=checkpoint_every_steps,
            tracking_uri=tracking_uri,
            experiment_name=experiment_name,
            run_id=run_id,
        )
        profiled = profile_training(model=trained.outputs["model"], tracking_uri=tracking_uri, run_id=run_id)
        evaluated = evaluate_model(
            model=trained.outputs["model"],
            snapshot=snap.outputs["snapshot"],
            dataset_md5=snap.outputs["md5"],
            label_column=label_column,
            thresholds=thresholds,
            model_name=model_name,
            tracking_uri=tracking_uri,
            run_id=run_id,
        )
        with dsl.If(evaluated.outputs["Output"] == True, name="gate-passed"):  # noqa: E712 (KFP condition syntax)
            registered = register_model(
                model=trained.outputs["model"],
                decision=evaluated.outputs["decision"],
                profile=profiled.outputs["profile"],
                model_name=model_name,
                alias=alias,
                tracking_uri=tracking_uri,
                run_id=run_id,
            )
            _configure(registered, profile.default, profile, caching=False)
        for task in (profiled, evaluated):
            _configure(task, profile.default, profile)
        for task in (validated, snap):
            _configure(task, profile.default, profile, caching=False)
        _configure(trained, profile.train, profile)
        trained.set_env_variable(name="TRAINPIPE_HARDWARE_PROFILE", value=profile.name)  # recorded in the lineage
        _kubernetes_settings(profile, trained, [validated, snap, trained, profiled, evaluated, registered])
        if policy_json != "{}":
            for task in (validated, snap, trained, profiled, evaluated, registered):
                task.set_env_variable(name=POLICY_ENV, value=policy_json)

    return training_pipeline


#: The pipeline with the CPU profile: what ``trainpipe compile`` emits by default.
training_pipeline = build_pipeline(PROFILES["cpu"])
