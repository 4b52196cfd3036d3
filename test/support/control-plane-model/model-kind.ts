import { ScriptableKind, type ScriptRecord } from "../../../participants/testing/scriptable-kind.js";
import type { KindReadiness } from "../../../participants/control-plane/participant-kind.js";

/**
 * ScriptableKind as a model-based test drives it: one-shot failures the test can also take back
 * (ScriptableKind's stay armed until the hook runs, which the model would have to track), and a
 * count of readiness checks that found blockers, so the test knows a prepare is waiting for them.
 */
export class ModelKind extends ScriptableKind {
  failClose = false;
  failInstall = false;
  failOpen = false;
  blockedChecks = 0;

  constructor() {
    super("environment");
  }

  override readiness(): KindReadiness {
    const readiness = super.readiness();
    if (readiness.blockers.length > 0) this.blockedChecks++;
    return readiness;
  }

  override async closeAdmission(): Promise<void> {
    if (this.failClose) {
      this.failClose = false;
      throw new Error("scripted closeAdmission failure");
    }
    await super.closeAdmission();
  }

  override async openAdmission(): Promise<void> {
    if (this.failOpen) {
      this.failOpen = false;
      throw new Error("scripted openAdmission failure");
    }
    await super.openAdmission();
  }

  override async install(records: ScriptRecord[]): Promise<void> {
    if (this.failInstall) {
      this.failInstall = false;
      throw new Error("scripted install failure");
    }
    await super.install(records);
  }
}
