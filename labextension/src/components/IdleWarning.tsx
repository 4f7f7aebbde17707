/**
 * The idle warning of "This session": in the last 10 minutes before the labfleet service stops
 * the session for inactivity, a countdown, why, and an "I'm still here" button.
 */
import { Button } from '@jupyterlab/ui-components';
import * as React from 'react';

import { idleWarning } from '../idlewarning';
import type { FleetStore } from '../store';

/** A warning sign in the current text colour. */
function WarnSign(): JSX.Element {
  return (
    <svg
      className="lf-idle-sign"
      viewBox="0 0 24 24"
      width="16"
      height="16"
      aria-hidden="true"
      focusable="false"
    >
      <path fill="currentColor" d="M1 21h22L12 2 1 21zm12-3h-2v-2h2v2zm0-4h-2v-4h2v4z" />
    </svg>
  );
}

export function IdleWarning(props: { store: FleetStore }): JSX.Element | null {
  const { store } = props;
  const idle = store.data.session?.idle;
  const w = idleWarning(idle, store.idleSecondsLeft());
  // After an "I'm still here" that left the warning up: said until the warning goes.
  const [outcome, setOutcome] = React.useState<'none' | 'noted' | 'failed'>('none');
  const shown = w !== null;
  React.useEffect(() => {
    if (!shown) {
      setOutcome('none');
    }
  }, [shown]);
  if (!w) {
    return null;
  }
  const onClick = () => {
    store.stillHere().then(
      () => setOutcome('noted'),
      () => setOutcome('failed')
    );
  };
  const [before, after] = w.title.split(w.countdown, 2);
  const ticking = w.secondsLeft > 0;
  return (
    <div
      className="lf-idle-warning"
      data-testid="lf-idle-warning"
      data-kind={w.kind}
      data-contention={w.contention ? 'true' : 'false'}
      data-seconds-left={Math.max(0, Math.ceil(w.secondsLeft))}
    >
      <div className="lf-idle-title" data-testid="lf-idle-title">
        <WarnSign />
        <span>
          {ticking ? (
            <>
              {before}
              <span className="lf-idle-countdown" data-testid="lf-idle-countdown">
                {w.countdown}
              </span>
              {after}
            </>
          ) : (
            w.title
          )}
        </span>
      </div>
      <div className="lf-idle-why" data-testid="lf-idle-why" title={w.detail}>
        {w.why}
      </div>
      {outcome === 'noted' && !store.stillHerePending ? (
        <div className="lf-idle-noted" data-testid="lf-idle-noted">
          {w.kind === 'utilization'
            ? 'Noted, but this rule looks at what the session uses, not at activity: ' +
              'use its CPU or GPU, or it stops.'
            : 'Noted: the idle timer started again.'}
        </div>
      ) : null}
      {outcome === 'failed' && store.stillHereError ? (
        <div className="lf-error" role="alert" data-testid="lf-idle-error">
          {store.stillHereError}
        </div>
      ) : null}
      <div className="lf-actions">
        <Button
          className="lf-primary"
          data-testid="lf-still-here"
          small
          disabled={store.stillHerePending}
          onClick={onClick}
          title="Count as activity now: the idle timer starts again"
        >
          I'm still here
        </Button>
      </div>
    </div>
  );
}
