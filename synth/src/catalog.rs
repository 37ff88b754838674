//! What the synthetic cluster runs: remote functions, actor classes and the errors they raise,
//! shaped like a data-processing and training workload.

/// A remote function: `module.function`, its typical duration, and how often it is called.
pub(crate) struct Function {
    pub(crate) module: &'static str,
    pub(crate) name: &'static str,
    pub(crate) median_ms: f64,
    pub(crate) weight: u32,
}

/// Remote functions, most popular first (call counts follow the weights).
pub(crate) const FUNCTIONS: &[Function] = &[
    Function {
        module: "pipeline.ingest",
        name: "read_shard",
        median_ms: 120.0,
        weight: 400,
    },
    Function {
        module: "pipeline.ingest",
        name: "decode_records",
        median_ms: 35.0,
        weight: 300,
    },
    Function {
        module: "pipeline.transform",
        name: "tokenize",
        median_ms: 18.0,
        weight: 250,
    },
    Function {
        module: "pipeline.transform",
        name: "normalize",
        median_ms: 9.0,
        weight: 200,
    },
    Function {
        module: "pipeline.transform",
        name: "dedupe_batch",
        median_ms: 60.0,
        weight: 120,
    },
    Function {
        module: "pipeline.transform",
        name: "augment_images",
        median_ms: 240.0,
        weight: 90,
    },
    Function {
        module: "pipeline.features",
        name: "embed_batch",
        median_ms: 410.0,
        weight: 80,
    },
    Function {
        module: "pipeline.features",
        name: "compute_stats",
        median_ms: 25.0,
        weight: 60,
    },
    Function {
        module: "pipeline.export",
        name: "write_parquet",
        median_ms: 150.0,
        weight: 50,
    },
    Function {
        module: "pipeline.export",
        name: "upload_part",
        median_ms: 700.0,
        weight: 30,
    },
    Function {
        module: "train.data",
        name: "prefetch_batch",
        median_ms: 45.0,
        weight: 40,
    },
    Function {
        module: "train.eval",
        name: "score_checkpoint",
        median_ms: 2400.0,
        weight: 8,
    },
    Function {
        module: "train.eval",
        name: "compute_metrics",
        median_ms: 80.0,
        weight: 15,
    },
    Function {
        module: "tune.search",
        name: "sample_config",
        median_ms: 4.0,
        weight: 12,
    },
    Function {
        module: "serve.batch",
        name: "predict",
        median_ms: 55.0,
        weight: 70,
    },
    Function {
        module: "utils.io",
        name: "list_prefix",
        median_ms: 300.0,
        weight: 10,
    },
    Function {
        module: "utils.io",
        name: "checksum_file",
        median_ms: 95.0,
        weight: 20,
    },
    Function {
        module: "utils.misc",
        name: "noop",
        median_ms: 1.0,
        weight: 25,
    },
];

/// An actor class and its methods.
pub(crate) struct ActorClass {
    pub(crate) module: &'static str,
    pub(crate) class: &'static str,
    pub(crate) methods: &'static [(&'static str, f64)],
}

/// Actor classes (method name, median duration in ms).
pub(crate) const ACTOR_CLASSES: &[ActorClass] = &[
    ActorClass {
        module: "train.worker",
        class: "TrainWorker",
        methods: &[
            ("train_step", 850.0),
            ("report", 3.0),
            ("save_checkpoint", 1900.0),
        ],
    },
    ActorClass {
        module: "serve.replica",
        class: "ModelReplica",
        methods: &[("handle_request", 22.0), ("reconfigure", 40.0)],
    },
    ActorClass {
        module: "pipeline.state",
        class: "ProgressTracker",
        methods: &[("update", 1.5), ("snapshot", 6.0)],
    },
];

/// A Python exception a task may raise, with the line it fails on.
pub(crate) struct Exception {
    pub(crate) class: &'static str,
    pub(crate) message: &'static str,
    pub(crate) code: &'static str,
}

/// Exceptions raised by user code (`TASK_EXECUTION_EXCEPTION`).
pub(crate) const EXCEPTIONS: &[Exception] = &[
    Exception {
        class: "ValueError",
        message: "invalid literal for int() with base 10: 'N/A'",
        code: "row[\"count\"] = int(row[\"count\"])",
    },
    Exception {
        class: "KeyError",
        message: "'label'",
        code: "label = record[\"label\"]",
    },
    Exception {
        class: "FileNotFoundError",
        message: "[Errno 2] No such file or directory: '/mnt/data/shard-00417.parquet'",
        code: "with open(path, \"rb\") as handle:",
    },
    Exception {
        class: "TimeoutError",
        message: "upstream did not answer within 30.0 s",
        code: "response = session.get(url, timeout=30.0)",
    },
    Exception {
        class: "RuntimeError",
        message: "CUDA error: device-side assert triggered",
        code: "loss = criterion(model(inputs), targets)",
    },
    Exception {
        class: "ZeroDivisionError",
        message: "division by zero",
        code: "mean = total / count",
    },
];

/// A multi-line Ray error message for an exception raised in `module.function`, as Ray formats
/// it (with the ANSI colour codes Ray puts around the task name).
pub(crate) fn user_exception(
    module: &str,
    function: &str,
    exception: &Exception,
    pid: u32,
    line: u32,
    detail: u64,
) -> String {
    let path = module.replace('.', "/");
    format!(
        "User exception:\n\u{1b}[36mray::{function}()\u{1b}[39m (pid={pid}, ip=127.0.0.1)\n  \
         File \"/app/{path}.py\", line {line}, in {function}\n    return _{function}_impl(batch)\n  \
         File \"/app/{path}.py\", line {inner}, in _{function}_impl\n    {code}\n\
         {class}: {message} (batch {detail})",
        inner = line + 37,
        code = exception.code,
        class = exception.class,
        message = exception.message,
    )
}

/// Ray's message for an attempt whose worker died.
pub(crate) const WORKER_DIED_MESSAGE: &str = "The worker died unexpectedly while executing this task. \
Check python-core-worker-*.log files for more information.";

/// Ray's message for an attempt killed by the memory monitor.
pub(crate) const OUT_OF_MEMORY_MESSAGE: &str = "Task was killed due to the node running low on memory.\n\
Memory on the node (IP: 127.0.0.1) where the task was running was 60.12GB / 62.00GB (0.969677), \
which exceeds the memory usage threshold of 0.95. Ray killed this worker because it was the most \
recently scheduled task.";
