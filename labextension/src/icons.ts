import { LabIcon } from '@jupyterlab/ui-components';

import fleetSvg from '../style/icons/fleet.svg';

/** Three stacked nodes: the fleet.  Its fill uses `jp-icon3`, so it follows the theme. */
export const fleetIcon = new LabIcon({
  name: '@labfleet/labextension:fleet',
  svgstr: fleetSvg
});
