// `npm start`: the gateway on embedded PGlite in ./.sandfork/data, or on DATABASE_URL.
import { loadConfig } from "./config.js";
import { startGateway } from "./server.js";

const gateway = await startGateway(loadConfig());
let stopping = false;
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    gateway.stop().then(
      () => process.exit(0),
      (error: unknown) => {
        console.error(error);
        process.exit(1);
      },
    );
  });
}
