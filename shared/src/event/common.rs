//! Messages and enums shared by several event types (`common.proto` in Ray).

use serde::{Deserialize, Serialize};

use super::encoding::{Id, opt_id, ray_enum};

ray_enum! {
    /// `ray.rpc.TaskStatus`. Declaration order is numeric order, and Ray's state API derives a
    /// task's state as the highest status ever reported (reference §4.3).
    pub enum TaskStatus {
        NIL = 0,
        PENDING_ARGS_AVAIL = 1,
        PENDING_NODE_ASSIGNMENT = 2,
        PENDING_OBJ_STORE_MEM_AVAIL = 3,
        PENDING_ARGS_FETCH = 4,
        SUBMITTED_TO_WORKER = 5,
        PENDING_ACTOR_TASK_ARGS_FETCH = 6,
        PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY = 7,
        RUNNING = 8,
        RUNNING_IN_RAY_GET = 9,
        RUNNING_IN_RAY_WAIT = 10,
        FINISHED = 11,
        FAILED = 12,
        GETTING_AND_PINNING_ARGS = 13,
    }
}

impl TaskStatus {
    /// True for the statuses Ray documents as "used for metrics only": sub-states that never
    /// decide a task's displayed state.
    pub fn is_metrics_only(&self) -> bool {
        matches!(
            self,
            Self::PENDING_OBJ_STORE_MEM_AVAIL
                | Self::PENDING_ARGS_FETCH
                | Self::RUNNING_IN_RAY_GET
                | Self::RUNNING_IN_RAY_WAIT
                | Self::GETTING_AND_PINNING_ARGS
        )
    }

    /// True for `FINISHED` and `FAILED`.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::FINISHED | Self::FAILED)
    }
}

ray_enum! {
    /// `ray.rpc.TaskType`. `ACTOR_TASK` only comes from `ACTOR_TASK_DEFINITION_EVENT`.
    pub enum TaskType {
        NORMAL_TASK = 0,
        ACTOR_CREATION_TASK = 1,
        ACTOR_TASK = 2,
        DRIVER_TASK = 3,
    }
}

ray_enum! {
    /// `ray.rpc.Language`.
    pub enum Language { PYTHON = 0, JAVA = 1, CPP = 2 }
}

ray_enum! {
    /// `ray.rpc.ErrorType` (2.60). Numbers were renumbered across releases; only names are
    /// stable, and the JSON carries names.
    pub enum ErrorType {
        WORKER_DIED = 0,
        ACTOR_DIED = 1,
        TASK_EXECUTION_EXCEPTION = 3,
        OBJECT_IN_PLASMA = 4,
        TASK_CANCELLED = 5,
        ACTOR_CREATION_FAILED = 6,
        RUNTIME_ENV_SETUP_FAILED = 7,
        OBJECT_LOST = 8,
        OWNER_DIED = 9,
        OBJECT_DELETED = 10,
        DEPENDENCY_RESOLUTION_FAILED = 11,
        OBJECT_UNRECONSTRUCTABLE_MAX_ATTEMPTS_EXCEEDED = 12,
        OBJECT_UNRECONSTRUCTABLE_LINEAGE_EVICTED = 13,
        OBJECT_FETCH_TIMED_OUT = 14,
        LOCAL_RAYLET_DIED = 15,
        TASK_PLACEMENT_GROUP_REMOVED = 16,
        ACTOR_PLACEMENT_GROUP_REMOVED = 17,
        TASK_UNSCHEDULABLE_ERROR = 18,
        ACTOR_UNSCHEDULABLE_ERROR = 19,
        OUT_OF_DISK_ERROR = 20,
        OBJECT_FREED = 21,
        OUT_OF_MEMORY = 22,
        NODE_DIED = 23,
        END_OF_STREAMING_GENERATOR = 24,
        ACTOR_UNAVAILABLE = 25,
        GENERATOR_TASK_FAILED_FOR_OBJECT_RECONSTRUCTION = 26,
        OBJECT_UNRECONSTRUCTABLE_PUT = 27,
        OBJECT_UNRECONSTRUCTABLE_RETRIES_DISABLED = 28,
        OBJECT_UNRECONSTRUCTABLE_BORROWED = 29,
        OBJECT_UNRECONSTRUCTABLE_REF_NOT_FOUND = 30,
        OBJECT_UNRECONSTRUCTABLE_TASK_CANCELLED = 31,
        OBJECT_UNRECONSTRUCTABLE_LINEAGE_DISABLED = 32,
        WORKER_STARTUP_FAILED = 33,
        STREAMING_GENERATOR_REPLAY_INCONSISTENT = 34,
    }
}

/// `ray.rpc.FunctionDescriptor`: exactly one language member is set (a oneof).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FunctionDescriptor {
    /// Set for Python functions and methods.
    #[serde(
        alias = "python_function_descriptor",
        skip_serializing_if = "Option::is_none"
    )]
    pub python_function_descriptor: Option<PythonFunctionDescriptor>,
    /// Set for Java functions.
    #[serde(
        alias = "java_function_descriptor",
        skip_serializing_if = "Option::is_none"
    )]
    pub java_function_descriptor: Option<LanguageFunctionDescriptor>,
    /// Set for C++ functions.
    #[serde(
        alias = "cpp_function_descriptor",
        skip_serializing_if = "Option::is_none"
    )]
    pub cpp_function_descriptor: Option<LanguageFunctionDescriptor>,
}

impl FunctionDescriptor {
    /// `(class name, function name)` from whichever language member is set.
    pub fn class_and_function(&self) -> Option<(&str, &str)> {
        if let Some(python) = &self.python_function_descriptor {
            return Some((&python.class_name, &python.function_name));
        }
        self.java_function_descriptor
            .as_ref()
            .or(self.cpp_function_descriptor.as_ref())
            .map(|other| (other.class_name.as_str(), other.function_name.as_str()))
    }

    /// `(module, class name, function name)` from whichever language member is set, in the
    /// order [`FunctionDescriptor::class_and_function`] reads them; only Python has a module.
    /// Taken, not copied: the attempt they are applied to keeps them.
    pub fn into_parts(self) -> (String, String, String) {
        if let Some(python) = self.python_function_descriptor {
            return (python.module_name, python.class_name, python.function_name);
        }
        self.java_function_descriptor
            .or(self.cpp_function_descriptor)
            .map(|other| (String::new(), other.class_name, other.function_name))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptors_parts_are_the_names_it_shows() {
        let names = |class: &str, function: &str| LanguageFunctionDescriptor {
            class_name: class.into(),
            function_name: function.into(),
        };
        let python = PythonFunctionDescriptor {
            module_name: "app.tasks".into(),
            class_name: "Worker".into(),
            function_name: "run".into(),
            function_hash: "ab".into(),
        };
        let descriptors = [
            FunctionDescriptor::default(),
            FunctionDescriptor {
                cpp_function_descriptor: Some(names("", "cpp_run")),
                ..Default::default()
            },
            FunctionDescriptor {
                java_function_descriptor: Some(names("io.Job", "java_run")),
                cpp_function_descriptor: Some(names("", "cpp_run")),
                ..Default::default()
            },
            FunctionDescriptor {
                python_function_descriptor: Some(python),
                java_function_descriptor: Some(names("io.Job", "java_run")),
                ..Default::default()
            },
        ];
        let modules = ["", "", "", "app.tasks"];
        for (descriptor, module) in descriptors.into_iter().zip(modules) {
            let shown = descriptor
                .class_and_function()
                .map(|(class, function)| (class.to_owned(), function.to_owned()))
                .unwrap_or_default();
            let parts = descriptor.into_parts();
            assert_eq!(parts, (module.to_owned(), shown.0, shown.1));
        }
    }
}

/// `ray.rpc.PythonFunctionDescriptor`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PythonFunctionDescriptor {
    /// Module that defines the function.
    #[serde(alias = "module_name")]
    pub module_name: String,
    /// Class for methods; empty for plain functions.
    #[serde(alias = "class_name")]
    pub class_name: String,
    /// Function or method name.
    #[serde(alias = "function_name")]
    pub function_name: String,
    /// Hash of the pickled function.
    #[serde(alias = "function_hash")]
    pub function_hash: String,
}

/// `ray.rpc.JavaFunctionDescriptor` / `CppFunctionDescriptor`: the fields both share.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LanguageFunctionDescriptor {
    /// Class name, where the language has one.
    #[serde(alias = "class_name")]
    pub class_name: String,
    /// Function name.
    #[serde(alias = "function_name")]
    pub function_name: String,
}

/// `ray.rpc.RayErrorInfo`: why an attempt failed.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RayErrorInfo {
    /// The formatted error, for user exceptions the Python traceback. Contains ANSI colour codes
    /// as sent; the state API strips them.
    #[serde(alias = "error_message")]
    pub error_message: String,
    /// Error category.
    #[serde(alias = "error_type")]
    pub error_type: ErrorType,
    /// Set when the error is an actor's death.
    #[serde(alias = "actor_died_error", skip_serializing_if = "Option::is_none")]
    pub actor_died_error: Option<ActorDeathCause>,
}

/// `ray.rpc.ActorDeathCause`: one of several contexts (a oneof). Only what a dashboard shows is
/// typed; the raw event keeps the rest.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ActorDeathCause {
    /// The actor's `__init__` raised.
    #[serde(
        alias = "creation_task_failure_context",
        skip_serializing_if = "Option::is_none"
    )]
    pub creation_task_failure_context: Option<RayException>,
    /// The runtime environment could not be set up.
    #[serde(
        alias = "runtime_env_failed_context",
        skip_serializing_if = "Option::is_none"
    )]
    pub runtime_env_failed_context: Option<ErrorContext>,
    /// The actor's worker, owner or node died, or it was killed.
    #[serde(
        alias = "actor_died_error_context",
        skip_serializing_if = "Option::is_none"
    )]
    pub actor_died_error_context: Option<ActorDiedErrorContext>,
    /// The actor could not be scheduled.
    #[serde(
        alias = "actor_unschedulable_context",
        skip_serializing_if = "Option::is_none"
    )]
    pub actor_unschedulable_context: Option<ErrorContext>,
    /// The actor's worker was killed for memory.
    #[serde(alias = "oom_context", skip_serializing_if = "Option::is_none")]
    pub oom_context: Option<ErrorContext>,
}

impl ActorDeathCause {
    /// The human-readable message of whichever context is set.
    pub fn message(&self) -> Option<&str> {
        self.creation_task_failure_context
            .as_ref()
            .map(|context| context.formatted_exception_string.as_str())
            .or_else(|| {
                self.actor_died_error_context
                    .as_ref()
                    .map(|context| context.error_message.as_str())
            })
            .or_else(|| {
                [
                    &self.runtime_env_failed_context,
                    &self.actor_unschedulable_context,
                    &self.oom_context,
                ]
                .into_iter()
                .flatten()
                .map(|context| context.error_message.as_str())
                .next()
            })
    }
}

/// `ray.rpc.RayException`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RayException {
    /// Language of the code that raised.
    pub language: Language,
    /// The formatted exception with traceback.
    #[serde(alias = "formatted_exception_string")]
    pub formatted_exception_string: String,
}

/// Contexts that carry only a message (`RuntimeEnvFailedContext`, `OomContext`, …).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ErrorContext {
    /// What went wrong.
    #[serde(alias = "error_message")]
    pub error_message: String,
}

ray_enum! {
    /// `ray.rpc.ActorDiedErrorContext.Reason`.
    pub enum ActorDiedReason {
        UNSPECIFIED = 0,
        WORKER_DIED = 1,
        OWNER_DIED = 2,
        NODE_DIED = 3,
        RAY_KILL = 4,
        OUT_OF_SCOPE = 5,
        REF_DELETED = 6,
    }
}

/// `ray.rpc.ActorDiedErrorContext`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ActorDiedErrorContext {
    /// Why the actor died, in words.
    #[serde(alias = "error_message")]
    pub error_message: String,
    /// Actor name, if named.
    pub name: String,
    /// Actor class.
    #[serde(alias = "class_name")]
    pub class_name: String,
    /// Pid of the actor's worker.
    pub pid: u32,
    /// IP address of the node the actor ran on.
    #[serde(alias = "node_ip_address")]
    pub node_ip_address: String,
    /// The actor.
    #[serde(alias = "actor_id", with = "opt_id")]
    pub actor_id: Option<Id>,
    /// True when the actor died before it started.
    #[serde(alias = "never_started")]
    pub never_started: bool,
    /// Why, as an enum.
    pub reason: ActorDiedReason,
}
