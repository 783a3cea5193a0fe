import { render } from 'preact';
import { init } from './actions';
import { App } from './components/App';
import './styles.css';

render(<App />, document.getElementById('app')!);
void init();
