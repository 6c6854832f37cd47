"""The small error hierarchy. Diagnoses are values; these are for things that stop a command."""


class DdpdoctorError(Exception):
    """Base of every error ddpdoctor raises on purpose; the CLI turns it into a clear message."""


class InputError(DdpdoctorError):
    """The user's input cannot be used at all (exit code 2)."""


class ConfigError(DdpdoctorError):
    """Options that contradict each other or name things that do not exist (exit code 2)."""


class SupervisorError(DdpdoctorError):
    """`ddpdoctor run` could not start or watch the job."""


class ProbeError(DdpdoctorError):
    """The in-process probe was misused."""
