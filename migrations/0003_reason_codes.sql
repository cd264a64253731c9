-- The reason codes of the audit log are the `ReasonCode` enum of the contracts; a
-- test in crates/store holds this list equal to it. A new code is a new migration.
ALTER TABLE transitions ADD CONSTRAINT transitions_reason_code_known CHECK (reason_code IN (
    'ejected',
    'degraded',
    'suspect',
    'cleared',
    'recovered',
    'trial_failed',
    'trial_succeeded',
    'failed_while_recovering',
    'ejection_refused',
    'forced_healthy',
    'forced_unhealthy',
    'maintenance_on',
    'override_cleared'
)) NOT VALID;
ALTER TABLE transitions VALIDATE CONSTRAINT transitions_reason_code_known;
