/**
 * The announcement banner at the top of the Fleet panel: what a superadmin published from the
 * admin console (maintenance windows, news), in JupyterLab's info or warning colours. The text
 * is rendered as text (React escapes it), with its line breaks.
 */
import * as React from 'react';

import type { IAnnouncement } from '../types';

const COLORS = {
  info: { background: 'var(--jp-info-color3)', edge: 'var(--jp-info-color1)' },
  warning: { background: 'var(--jp-warn-color3)', edge: 'var(--jp-warn-color1)' }
};

export function AnnouncementBanner(props: {
  announcement: IAnnouncement | null | undefined;
}): JSX.Element | null {
  const a = props.announcement;
  if (!a || typeof a.text !== 'string' || !a.text.trim()) {
    return null;
  }
  const level = a.level === 'warning' ? 'warning' : 'info';
  const c = COLORS[level];
  return (
    <div
      className={`lf-announcement lf-announcement-${level}`}
      data-testid="lf-announcement"
      data-level={level}
      role={level === 'warning' ? 'alert' : 'status'}
      style={{
        margin: '6px 8px 2px 8px',
        padding: '6px 10px',
        backgroundColor: c.background,
        borderLeft: `3px solid ${c.edge}`,
        borderRadius: '2px',
        color: 'var(--jp-ui-font-color1)',
        fontSize: 'var(--jp-ui-font-size1)',
        lineHeight: 1.4,
        whiteSpace: 'pre-line',
        overflowWrap: 'anywhere'
      }}
    >
      {a.text}
    </div>
  );
}
