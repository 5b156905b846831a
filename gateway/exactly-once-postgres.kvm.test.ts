// Exactly-once billing under SIGKILL of the gateway or the daemon, on a PostgreSQL server
// (TEST_DATABASE_URL): the tests are in gateway/testing/exactly-once.ts, one file a backend so
// that the KVM tier can run them side by side.
import { describeExactlyOnce } from "./testing/exactly-once.js";

describeExactlyOnce("postgres");
